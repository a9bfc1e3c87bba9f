"""The `tandem` command. Subcommands live with their component; the table names them by
module so that `tandem make-model` never imports the router, and the engine never imports a
component above it."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with add_arguments(parser) and run(args), help)
COMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("tandem.engine.tiny_model", "write a small random checkpoint"),
    "generate": ("tandem.engine.generate_cli", "generate offline from a model folder"),
    "prefill": ("tandem.prefill_node.cli", "run a prefill node"),
    "decode": ("tandem.decode_node.cli", "run a decode node"),
    "router": ("tandem.router.cli", "run the OpenAI-compatible router"),
    "serve": ("tandem.router.serve", "run router, prefill and decode locally"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tandem", description="Disaggregated LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        sub_parser.set_defaults(module=module)
        importlib.import_module(module).add_arguments(sub_parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    importlib.import_module(args.module).run(args)


if __name__ == "__main__":
    main()
