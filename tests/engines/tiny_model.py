"""A tiny language model and its data for the engines' end-to-end runs on CPU: token embedding,
two pre-norm MLP blocks and an output projection, trained to predict the next token of a fixed
periodic sequence (so the loss has somewhere to go in a few steps)."""
import torch

VOCAB, DIM, SEQ = 32, 32, 16


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(),
                                torch.nn.Linear(2 * DIM, DIM)) for _ in range(2))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def batch(step, rank, size):
    """`size` sequences of SEQ + 1 tokens, different per step and rank, same on every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    tokens = (start + torch.arange(SEQ + 1) * 3) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(logits, targets):
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
