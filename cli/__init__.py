"""The `tandem` command. Subcommands live with their component; the table names them by
module, and only the module of the subcommand that runs is imported: `tandem operator`
loads no torch, `tandem make-model` never imports the router, and the engine never imports
a component above it."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> (module with add_arguments(parser) and run(args), help)
COMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("tandem.engine.tiny_model", "write a small random checkpoint"),
    "generate": ("tandem.engine.generate_cli", "generate offline from a model folder"),
    "prefill": ("tandem.prefill_node.cli", "run a prefill node"),
    "decode": ("tandem.decode_node.cli", "run a decode node"),
    "router": ("tandem.router.cli", "run the OpenAI-compatible router"),
    "serve": ("tandem.router.serve", "run router, prefill and decode locally"),
    "operator": ("tandem.operator.cli", "run the Kubernetes operator for LLMDeployments"),
    "simulate": ("tandem.sim.cli", "simulate a deployment on a workload in simulated time"),
    "plan": ("tandem.sim.plan_cli", "find the cheapest deployment that meets SLOs, by simulation"),
    "planner": (
        "tandem.planner.cli",
        "run the SLO planner of one LLMDeployment (the operator's child)",
    ),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="tandem", description="Disaggregated LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub_parsers = {
        name: sub.add_parser(name, help=help_text) for name, (_, help_text) in COMMANDS.items()
    }
    # Only the chosen subcommand's module is imported (and its flags added); the top-level
    # parser has no flags of its own but --help, so the subcommand is the first argument.
    name = argv[0] if argv else None
    if name not in COMMANDS:
        parser.parse_args(argv)  # usage, --help or an unknown command: argparse exits
        return
    module = importlib.import_module(COMMANDS[name][0])
    add_subcommand_arguments(sub_parsers[name], module)
    # the file first: it may hold flags the subcommand requires (the operator's pods pass
    # nothing but --config)
    config = config_path(argv[1:])
    if config:
        apply_config(sub_parsers[name], config)
    module.run(parser.parse_args(argv))


def add_subcommand_arguments(parser: argparse.ArgumentParser, module: object) -> None:
    """The subcommand's own flags, plus `--config FILE` that every subcommand takes."""
    module.add_arguments(parser)
    parser.add_argument(
        "--config", metavar="FILE",
        help="JSON object of flag -> value, e.g. {\"http-port\": 8000}; "
        "flags given on the command line win",
    )  # fmt: skip


def config_path(argv: list[str]) -> str | None:
    """The value of `--config` among a subcommand's arguments, if any."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    return pre.parse_known_args(argv)[0].config


def apply_config(parser: argparse.ArgumentParser, path: str) -> None:
    """Make the flags in the JSON file at `path` the parser's defaults (the operator's
    ConfigMap holds one such file per role). Unknown flags and bad choices are errors."""
    try:
        with open(path) as f:
            values = json.load(f)
    except (OSError, ValueError) as exc:
        parser.error(f"--config {path}: {exc}")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: must hold a JSON object")
    actions = {a.dest: a for a in parser._actions}
    for flag, value in values.items():
        action = actions.get(flag.replace("-", "_"))
        if action is None or not action.option_strings or flag in ("config", "help"):
            parser.error(f"--config {path}: unknown flag {flag!r}")
        if action.choices is not None and value not in action.choices:
            parser.error(f"--config {path}: {flag} must be one of {list(action.choices)}")
        action.required = False
        parser.set_defaults(**{action.dest: value})


if __name__ == "__main__":
    main()
