"""The `toolbox` command line: a thin click layer; each subcommand lives in `toolbox/commands/<name>.py`."""

from __future__ import annotations

import importlib

import click

# subcommand name -> module in toolbox.commands exposing a click command named `command`
SUBCOMMANDS = {
    "check": "Run the main job: validate the knowledge base, run every contract on the CPU, generate with the default model.",
    "validate": "Validate skills and contracts (schema, cross references, versions).",
    "test": "Run contract cases against an implementation or an engine.",
    "bench": "Time an implementation against a contract's roofline (CUDA).",
    "skills": "List, show, locate or install skills for an agent.",
    "new": "Scaffold a new skill or contract that validates as generated.",
    "site": "Build or serve the knowledge site.",
    "engine": "The reference engine: generate, bench, quantize.",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when it is used, so `toolbox --help` stays fast (no torch import)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module = importlib.import_module(f"toolbox.commands.{name}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, summary) for name, summary in SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  toolbox check                                  # the main job, on the CPU
  toolbox validate                               # knowledge/ and contracts/
  toolbox skills path gated-attention            # the file an agent should load
  toolbox test norms-and-activations/rmsnorm --impl mypkg.ops:rms_norm
  toolbox test --engine reference_engine --device cpu
""",
)
@click.version_option(package_name="inference-skills-toolbox")
def main() -> None:
    """Knowledge base and toolkit for building hyper-specialised LLM inference engines."""


if __name__ == "__main__":
    main()
