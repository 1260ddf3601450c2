#!/usr/bin/env python3
"""bench/rank_layouts.py's parts whose verdict does not depend on the machine's pace: Kendall's tau-b
on inputs with known values, the ranks, bad input, and (given a build folder) the sample's plans.

  python3 tests/bench/rank_layouts_test.py [BUILD_DIR]    # BUILD_DIR: with dplan, for the plan-only case
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "rank_layouts.py")
spec = importlib.util.spec_from_file_location("rank_layouts", SCRIPT)
rank_layouts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rank_layouts)


def read_json(path):
    with open(path) as f:
        return json.load(f)


BUILD_DIR = os.path.abspath(sys.argv.pop(1)) if __name__ == "__main__" and len(sys.argv) > 1 else None


class KendallTauB(unittest.TestCase):
    def test_identical_and_reversed_orders(self):
        k = rank_layouts.kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40])
        self.assertEqual((k["tau"], k["concordant"], k["discordant"], k["pairs"]), (1.0, 6, 0, 6))
        k = rank_layouts.kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1])
        self.assertEqual((k["tau"], k["concordant"], k["discordant"]), (-1.0, 0, 6))

    def test_no_ties_is_tau_a(self):
        # Pairs of (1,2,3,4,5) against (3,4,1,2,5): 6 concordant, 4 discordant, tau = 2/10.
        k = rank_layouts.kendall_tau_b([1, 2, 3, 4, 5], [3, 4, 1, 2, 5])
        self.assertEqual((k["concordant"], k["discordant"]), (6, 4))
        self.assertAlmostEqual(k["tau"], 0.2, places=15)
        # var(S) = n(n-1)(2n+5)/18 = 5*4*15/18 without ties.
        self.assertAlmostEqual(k["z"], 2 / math.sqrt(5 * 4 * 15 / 18), places=12)

    def test_ties_on_both_sides(self):
        # scipy.stats.kendalltau's documented example: tau -0.47140452079103173, p 0.2827454599327748.
        k = rank_layouts.kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0])
        self.assertAlmostEqual(k["tau"], -0.47140452079103173, places=12)
        self.assertAlmostEqual(k["p"], 0.2827454599327748, places=12)
        # (12, 12) is tied in both; (2, 2) only in x; 2 concordant and 6 discordant of the 10 pairs.
        self.assertEqual((k["concordant"], k["discordant"], k["tied_x"], k["tied_y"], k["tied_both"]), (2, 6, 1, 0, 1))
        # By hand: (2 - 6) / sqrt((10 - 2) (10 - 1)).
        self.assertAlmostEqual(k["tau"], -4 / math.sqrt(8 * 9), places=15)

    def test_constant_side_is_undefined(self):
        k = rank_layouts.kendall_tau_b([1, 1, 1], [1, 2, 3])
        self.assertIsNone(k["tau"])
        self.assertIsNone(k["p"])

    def test_average_ranks_share_ties(self):
        self.assertEqual(rank_layouts.average_ranks([0.3, 0.1, 0.3, 0.2]), [3.5, 1.0, 3.5, 2.0])

    def test_ordinals(self):
        self.assertEqual([rank_layouts.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)],
                         ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"])


class BadInput(unittest.TestCase):
    def run_script(self, *args, env=None):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              env=dict(os.environ, **(env or {})))

    def assert_one_line(self, r, text):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn(text, r.stderr)

    def test_each_is_one_line_and_exit_2(self):
        self.assert_one_line(self.run_script("--layouts", "1"), "rank_layouts: error: --layouts 1:")
        self.assert_one_line(self.run_script("--steps", "1", "--warmup", "1"), "--steps 1: must exceed --warmup 1")
        self.assert_one_line(self.run_script("--rounds", "0"), "--rounds 0")
        self.assert_one_line(self.run_script("--pool", "1001"), "--pool 1001")
        self.assert_one_line(self.run_script("--bogus"), "unrecognized arguments: --bogus; valid: --layouts N")
        self.assert_one_line(self.run_script("--force"), "--force without --out")
        self.assert_one_line(self.run_script(env={"BUILD_DIR": "/nonexistent-build"}), "is not built")
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "keep.txt"), "w").close()
            self.assert_one_line(self.run_script("--plan-only", "--out", d, env={"BUILD_DIR": BUILD_DIR or "/nonexistent-build"}),
                                 "is not built" if not BUILD_DIR else "the folder is not empty")
            self.assertEqual(os.listdir(d), ["keep.txt"])


@unittest.skipUnless(BUILD_DIR, "give BUILD_DIR (with dplan) for the plan-only case")
class PlanOnly(unittest.TestCase):
    def test_the_sample_is_planned_as_the_search_listed_it(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            r = subprocess.run([sys.executable, SCRIPT, "--plan-only", "--layouts", "4", "--seed", "3", "--out", out],
                               capture_output=True, text=True, env=dict(os.environ, BUILD_DIR=BUILD_DIR))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertNotIn("warning", r.stderr)
            results = read_json(os.path.join(out, "results.json"))
            layouts = results["layouts"]
            self.assertEqual(len(layouts), 4)
            self.assertEqual(layouts[0]["search_rank"], 1)  # the search's pick is always measured
            for it in layouts:
                plan = read_json(os.path.join(out, it["plan"]))
                self.assertEqual(plan["parallel"], it["parallel"])
                self.assertAlmostEqual(it["predicted_s"], it["listed_s"], places=9)
            # The same seed draws the same sample.
            again = os.path.join(d, "again")
            subprocess.run([sys.executable, SCRIPT, "--plan-only", "--layouts", "4", "--seed", "3", "--out", again],
                           capture_output=True, env=dict(os.environ, BUILD_DIR=BUILD_DIR), check=True)
            self.assertEqual([it["search_rank"] for it in read_json(os.path.join(again, "results.json"))["layouts"]],
                             [it["search_rank"] for it in layouts])


if __name__ == "__main__":
    unittest.main()
