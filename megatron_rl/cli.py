"""``megatron-rl``: the command line. Each command parses its words and calls into the rooms."""

from __future__ import annotations

import argparse
import sys

from megatron_rl.tiny import ARCHS, SIZES

_OVERRIDES_HELP = "recipe=NAME and key=value overrides (e.g. recipe=tiny_cpu run.seed=1)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megatron-rl", description="RL post-training on megatron-core with vLLM sampling.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tiny = sub.add_parser("make-tiny-model", help="write a random-initialised HF checkpoint and tokenizer")
    tiny.add_argument("--arch", choices=ARCHS, required=True)
    tiny.add_argument("--out", required=True, help="output folder (reused if it holds the same spec)")
    tiny.add_argument("--size", choices=tuple(SIZES), default="unit")
    tiny.add_argument("--seed", type=int, default=0)
    train = sub.add_parser("train", help="run RL training (default recipe: tiny_cpu)")
    train.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    show = sub.add_parser("config", help="print the resolved config of a recipe with overrides")
    show.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    return p


def _make_tiny_model(args) -> None:
    from megatron_rl.tiny import make_tiny_model

    print(make_tiny_model(args.arch, args.out, size=args.size, seed=args.seed))


def _config(args) -> None:
    from megatron_rl.config import load_config, to_yaml

    print(to_yaml(load_config(args.overrides)), end="")


def _train(args) -> None:
    from megatron_rl.config import load_config
    from megatron_rl.schedules.job import train

    print(f"run folder: {train(load_config(args.overrides))}")


COMMANDS = {"make-tiny-model": _make_tiny_model, "train": _train, "config": _config}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except ValueError as err:
        print(f"megatron-rl {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
