"""`tandem operator --render` and the `--config FILE` every `tandem` command takes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types

import pytest
import yaml

from tandem import cli
from tandem.cli import apply_config
from tandem.operator.render import render
from tests.bounds import PROCESS_S
from tests.operator.crd_schema import EXAMPLES, example

TANDEM = [sys.executable, "-P", "-m", "tandem.cli"]


def test_render_prints_the_children():
    argv = [*TANDEM, "operator", "--render", str(EXAMPLES / "minimal.yaml")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=PROCESS_S, check=True)
    printed = list(yaml.safe_load_all(result.stdout))
    llmd = example("minimal")
    del llmd["metadata"]["uid"]
    assert printed == render(llmd)


def test_render_refuses_an_invalid_file_naming_the_field(tmp_path):
    llmd = example("minimal")
    llmd["spec"]["decode"] = {"replicas": 0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(llmd))
    result = subprocess.run([*TANDEM, "operator", "--render", str(path)],
                            capture_output=True, text=True, timeout=PROCESS_S)  # fmt: skip
    assert result.returncode == 1
    assert "spec.decode.replicas: must be at least 1" in result.stderr


def _parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=1)
    parser.add_argument("--policy", choices=("a", "b"), default="a")
    parser.add_argument("--no-prefix-caching", action="store_true")
    return parser


def test_config_values_become_defaults_and_the_command_line_wins(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "/m", "port": 9, "no-prefix-caching": True}))
    parser = _parser()
    apply_config(parser, str(path))
    args = parser.parse_args(["--port", "10"])
    assert (args.model, args.port, args.no_prefix_caching) == ("/m", 10, True)


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"colour": 1}', "unknown flag 'colour'"), ('{"policy": "c"}', "policy must be one of"),
     ("[1]", "must hold a JSON object"), ("{", "Expecting")],
)  # fmt: skip
def test_bad_config_files_are_refused(tmp_path, capsys, content, message):
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(SystemExit):
        apply_config(_parser(), str(path))
    assert message in capsys.readouterr().err


def test_a_command_takes_its_required_flags_from_the_config_file(tmp_path, monkeypatch):
    """The operator's pods run `tandem <role> --config FILE` and nothing else: a flag the
    subcommand requires may come from the file alone."""
    seen = []
    module = types.ModuleType("probe_command")
    module.add_arguments = lambda parser: parser.add_argument("--model", required=True)
    module.run = seen.append
    monkeypatch.setitem(sys.modules, "probe_command", module)
    monkeypatch.setitem(cli.COMMANDS, "probe", ("probe_command", "a test's command"))
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "/models/m"}))
    cli.main(["probe", "--config", str(path)])
    assert seen[0].model == "/models/m"
    cli.main(["probe", f"--config={path}", "--model", "/other"])
    assert seen[1].model == "/other"


def test_the_resource_offers_the_routers_tool_call_parsers():
    from tandem.operator.spec import TOOL_CALL_PARSERS
    from tandem.router.cli import TOOL_PARSER_CHOICES

    assert TOOL_CALL_PARSERS == TOOL_PARSER_CHOICES
