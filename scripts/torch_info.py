"""The PyTorch 2.x that the python running this imports, for a build against it: its version, its
CUDA version ("none" for a CPU build) and its torch folder (what CMAKE_PREFIX_PATH takes). Exit 1
when that python has no PyTorch, or a 1.x (Debian's python3-torch is 1.13). One owner for
setup.sh (`python scripts/torch_info.py`: "VERSION CUDA DIR") and scripts/gpu_check.py (--json)."""
import json
import os
import sys

try:
    import torch
except Exception:
    sys.exit(1)
if int(torch.__version__.split(".")[0]) < 2:
    sys.exit(1)
folder = os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path))
if "--json" in sys.argv[1:]:
    print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "dir": folder}))
else:
    print(torch.__version__, torch.version.cuda or "none", folder)
