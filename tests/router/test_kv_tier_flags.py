"""`--kv-host-hit-cost` and `--kv-disk-hit-cost`: fractions of a computed block, refused
outside [0, 1] by `tandem router` and `tandem serve`, and passed on by serve."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tandem.router import cli, serve
from tandem.router.policy import DEFAULT_TIER_COSTS


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem")
    module.add_arguments(parser)
    return parser


ROUTER = ["--model", "m"]


def test_the_defaults_are_the_policys():
    args = parser_of(cli).parse_args(ROUTER)
    assert (args.kv_host_hit_cost, args.kv_disk_hit_cost) == (0.1, 0.3)
    costs = DEFAULT_TIER_COSTS
    assert (args.kv_host_hit_cost, args.kv_disk_hit_cost) == (
        costs.host_hit_cost, costs.disk_hit_cost,
    )  # fmt: skip


@pytest.mark.parametrize("module", [cli, serve])
@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--kv-host-hit-cost", "1.5", "1.5 is not within [0, 1]"),
        ("--kv-disk-hit-cost", "-0.2", "-0.2 is not within [0, 1]"),
        ("--kv-host-hit-cost", "nan", "nan is not within [0, 1]"),
        ("--kv-disk-hit-cost", "cheap", "'cheap' is not a number"),
    ],
)
def test_a_cost_outside_zero_to_one_is_refused_naming_the_flag(module, flag, value, says, capsys):
    base = ROUTER if module is cli else []
    with pytest.raises(SystemExit) as raised:
        parser_of(module).parse_args([*base, f"{flag}={value}"])
    assert raised.value.code == 2
    assert f"argument {flag}: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "1", "0.05"])
def test_the_bounds_and_values_between_are_accepted(value):
    args = parser_of(cli).parse_args([*ROUTER, "--kv-host-hit-cost", value])
    assert args.kv_host_hit_cost == float(value)


def test_serve_hands_the_costs_to_its_router():
    args = parser_of(serve).parse_args(["--kv-host-hit-cost", "0.2", "--kv-disk-hit-cost", "1"])
    router = serve.plan(args, Path("model"))[-1]
    assert router.name == "router"
    flags = parser_of(cli).parse_args(router.cmd[router.cmd.index("--model") :])
    assert (flags.kv_host_hit_cost, flags.kv_disk_hit_cost) == (0.2, 1.0)
