"""``refimpl report`` runs in-process through the CLI and prints numbers that agree with
independently computed values (BFS distances for the grid world, the closed forms of
mdp.md sections 7.1 / 7.2, a power series for the random MDP's return)."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from fractions import Fraction

import numpy as np
import pytest

from refimpl.cli import main
from tabular.examples import random_mdp, random_policy
from tests.test_tabular_examples import bfs_distances

UP, RIGHT, DOWN, LEFT = "↑", "→", "↓", "←"
MOVES = {
    UP: (-1, 0),
    RIGHT: (0, 1),
    DOWN: (1, 0),
    LEFT: (0, -1),
    "^": (-1, 0),
    ">": (0, 1),
    "v": (1, 0),
    "<": (0, -1),
}


@pytest.fixture(scope="module")
def report_text():
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["report"])
    assert code == 0
    return buf.getvalue()


def test_report_runs_through_the_cli_entry_point(capsys):
    assert main(["report", "--seed", "1", "--gamma", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "gamma = 0.5" in out and "seed 1" in out
    assert "NO" not in out


def test_grid_values_and_arrows(report_text):
    lines = report_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Reward on arrival")) + 1
    value_rows = [line.split() for line in lines[start : start + 8]]
    dist = bfs_distances(8, (0, 7), (3, 3))
    for r, row in enumerate(value_rows):
        assert len(row) == 8
        for c, text in enumerate(row):
            if (r, c) == (0, 7):
                assert text == "GOAL"
            elif (r, c) == (3, 3):
                assert text == "TRAP"
            else:
                assert float(text) == pytest.approx(0.9 ** (dist[(r, c)] - 1), abs=5e-4)
    arrow_start = next(i for i, line in enumerate(lines) if line.startswith("Greedy policy")) + 1
    arrow_rows = [line.split() for line in lines[arrow_start : arrow_start + 8]]
    for r, row in enumerate(arrow_rows):
        for c, arrow in enumerate(row):
            if (r, c) in ((0, 7), (3, 3)):
                assert arrow == ("G" if (r, c) == (0, 7) else "T")
                continue
            dr, dc = MOVES[arrow]
            target = (r + dr, c + dc)
            # every arrow steps onto a shortest path to the goal (never into a wall or the trap)
            assert dist.get(target, -1) == dist[(r, c)] - 1


def number_after(text, label):
    match = re.search(re.escape(label) + r"\s*:?\s*=?\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?)", text)
    assert match, label
    return float(match.group(1))


def test_pi_vi_agreement_lines(report_text):
    assert number_after(report_text, "max |V_PI - V_VI|") <= 0.5e-8
    assert number_after(report_text, "max (V* - V of VI's policy)") <= 1e-8
    assert "VI's actions optimal under Q*      : yes" in report_text


def test_example_4_1_1_numbers(report_text):
    g, M, eta, eta2 = Fraction(9, 10), 100, Fraction(1, 10**4), Fraction(1, 10**3)
    V1 = 1 - eta2 * (1 + M)
    J, J_new = eta * g * V1, -g * M
    gain = g * ((1 - eta) * V1 - eta * (1 + M) * (1 - eta2))
    assert re.search(rf"J\(pi\)\s*=\s*{J.numerator}/{J.denominator}\s*=\s*8\.091000e-05", report_text)
    assert re.search(r"J\(pi'\)\s*=\s*-90\s*=\s*-90", report_text)
    assert re.search(
        rf"L_pi\(pi'\) - J\(pi\)\s*=\s*{gain.numerator}/{gain.denominator}\s*=\s*0\.79993818", report_text
    )
    diff = J_new - J
    assert re.search(rf"J\(pi'\) - J\(pi\)\s*=\s*{diff.numerator}/{diff.denominator}", report_text)
    assert "float path agrees : yes" in report_text


def test_example_4_1_2_variances(report_text):
    base = Fraction(81, 100) / Fraction(1, 2) + Fraction(1, 100) / Fraction(1, 2)
    for H in (1, 2, 5, 10, 20, 50):
        match = re.search(rf"H = {H:2d}: Var\[w\] = ([0-9.e+-]+)\s+(\S+)", report_text)
        assert match, H
        assert float(match.group(1)) == pytest.approx(float(base**H - 1), rel=1e-6, abs=0.0)
        if H <= 5:
            assert Fraction(match.group(2)) == base**H - 1


def test_bound_section_matches_an_independent_return(report_text):
    rng = np.random.default_rng(0)
    mdp = random_mdp(rng, num_states=10, num_actions=4, gamma=0.9, zero_fraction=0.3)
    pi = random_policy(rng, 10, 4)
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    term, V = np.einsum("sa,sa->s", pi, mdp.r), np.zeros(10)
    for _ in range(400):
        V += term
        term = 0.9 * P_pi @ term
    assert number_after(report_text, "J(pi)                        =") == pytest.approx(
        mdp.rho0 @ V, abs=1e-9
    )
    J_mix = number_after(report_text, "J(mixture)                   =")
    bound = number_after(report_text, "CPI bound (Kakade-Langford)  =")
    assert J_mix >= bound
    assert report_text.count("holds: yes") == 3
