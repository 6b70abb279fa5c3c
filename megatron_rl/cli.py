"""``megatron-rl``: the command line. Each command parses its words and calls into the rooms."""

from __future__ import annotations

import argparse
import sys

from megatron_rl.tiny import ARCHS, SIZES

_OVERRIDES_HELP = "recipe=NAME and key=value overrides (e.g. recipe=tiny_cpu run.seed=1)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose epilog may be a function, called only when help is printed (it reads the
    recipes and the config's docstrings, which other commands need not pay for)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


class _Intermixed(_Parser):
    """A parser whose ``key=value`` words may come before and after its flags (``submit recipe=X --nodes 2 k=v``)."""

    _inside = False

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:  # parse_known_intermixed_args calls back in here
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def _train_epilog() -> str:
    from megatron_rl.config.describe import train_epilog

    return train_epilog()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megatron-rl", description="RL post-training on megatron-core with vLLM sampling.")
    p.add_argument("-v", "--verbose", action="store_true", help="show the traceback of an error, not only its line")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    tiny = sub.add_parser("make-tiny-model", help="write a random-initialised HF checkpoint and tokenizer")
    tiny.add_argument("--arch", choices=ARCHS, required=True)
    tiny.add_argument("--out", required=True, help="output folder (reused if it holds the same spec)")
    tiny.add_argument("--size", choices=tuple(SIZES), default="unit")
    tiny.add_argument("--seed", type=int, default=0)
    train = sub.add_parser("train", help="run RL training (default recipe: tiny_cpu)", epilog=_train_epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    show = sub.add_parser("config", help="print the resolved config of a recipe with overrides")
    show.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    show.add_argument("--describe", action="store_true", help="each key with its docstring (and its default when changed)")
    plan = sub.add_parser("plan", help="print placement, per-GPU memory and weight-transfer time on a cluster; starts nothing")
    plan.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP + "; cluster=NODESxGPUSxKIND[@GBIT_S] (default 1x8xH100)")
    fleet = sub.add_parser("serve", help="start the vLLM fleet behind an OpenAI-compatible router; Ctrl-C stops it")
    fleet.add_argument("overrides", nargs="*", help="model=DIR, inference.num_servers=N and other training keys (or "
                       "inference.num_servers=0 inference.external_server_urls=[URL,...] to front running servers)")
    fleet.add_argument("--host", default="127.0.0.1", help="address the router listens on")
    fleet.add_argument("--port", type=int, default=8000, help="port the router listens on")
    tk = sub.add_parser("serve-training", help="serve the Tinker training API (the official tinker SDK) over the trainer and fleet")
    tk.add_argument("overrides", nargs="*", help="model=DIR and trainer.*, inference.*, weight_transfer.*, algorithm.* keys")
    tk.add_argument("--host", default="127.0.0.1")
    tk.add_argument("--port", type=int, default=8100)
    tk.add_argument("--lora-as-full-finetune", action="store_true",
                    help="accept LoRA requests (the SDK always sends a rank) and train all weights; refused otherwise")
    serve = sub.add_parser("serve-envs", help="serve a bundle's environments over HTTP/WebSocket (one session per episode)")
    serve.add_argument("bundle", help="module, .py file or folder registering envs (and TASKS); 'builtin' for the built-ins")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--token-env", help="environment variable holding the bearer token (unset: no auth)")
    serve.add_argument("--max-concurrent", type=int, default=64, help="episodes at once; more wait for a slot")
    serve.add_argument("--max-wait-s", type=float, default=60.0, help="longest wait for a slot before refusing")
    rows = sub.add_parser("write-rows", help="write remote-env train/eval rows from an env server's tasks")
    rows.add_argument("url", help="env server URL (http://host:port)")
    rows.add_argument("out_dir")
    rows.add_argument("--tokenizer", required=True, help="folder of the policy's tokenizer (its chat template renders the tools)")
    rows.add_argument("--token-env", help="environment variable holding the server's token (the rows carry only this name)")
    rows.add_argument("--max-prompt-length", type=int, default=512, help="drop rows whose rendered prompt is longer")
    rows.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    _slurm_parser(sub)
    return p


def _slurm_parser(sub) -> None:
    slurm = sub.add_parser("slurm", help="submit a run to Slurm (Ray head and workers over srun, then the driver)")
    cmds = slurm.add_subparsers(dest="slurm_command", required=True, metavar="SLURM_COMMAND", parser_class=_Intermixed)
    s = cmds.add_parser("submit", help="write the sbatch script (slurm/ray.sbatch), check the placement fits, submit it")
    s.add_argument("overrides", nargs="*", help=_OVERRIDES_HELP)
    s.add_argument("--nodes", type=int, required=True, help="nodes to allocate (the Ray head runs on the first)")
    s.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per node (0 for CPU nodes)")
    s.add_argument("--time", required=True, help="time limit (MINUTES, HH:MM:SS or DAYS-HH:MM:SS)")
    s.add_argument("--partition", default="")
    s.add_argument("--account", default="")
    s.add_argument("--container-image", default="", help="pyxis/enroot image every task runs in")
    s.add_argument("--container-mounts", default="", help="pyxis mounts (SRC:DST,...): the run folder and this tree")
    s.add_argument("--gpu-kind", default="H100", help="GPU kind for the placement and memory check (H100, H200, ...)")
    s.add_argument("--env", action="append", default=[], help="NAME=VALUE exported on every node (repeatable)")
    s.add_argument("--node-setup", default="", help="bash file sourced on every node before Ray starts")
    s.add_argument("--ray-wait-s", type=int, default=600, help="fail the job if a node has not joined Ray by then")
    s.add_argument("--sbatch", action="append", default=[], dest="sbatch_args",
                   help="one more #SBATCH option, e.g. --sbatch=--qos=high (repeatable)")
    s.add_argument("--dry-run", action="store_true", help="print the plan and the script; submit nothing")
    w = cmds.add_parser("wait-nodes", help="(run by the sbatch script) wait until every node joined Ray")
    w.add_argument("--address", required=True, help="the Ray head's address")
    w.add_argument("--nodes", nargs="+", required=True, help="the job's node names, head first")
    w.add_argument("--gpus-per-node", type=int, default=0)
    w.add_argument("--timeout", type=float, required=True, help="seconds before failing, naming the missing nodes")


def _slurm(args) -> None:
    if args.slurm_command == "wait-nodes":
        from megatron_rl.launch.ray_wait import wait_for_nodes

        wait_for_nodes(args.address, args.nodes, args.gpus_per_node, args.timeout)
        return
    from megatron_rl.launch.slurm import SubmitRequest, submit

    req = SubmitRequest(args.overrides, args.nodes, args.gpus_per_node, args.time, args.partition, args.account,
                        args.container_image, args.container_mounts, args.gpu_kind, args.env, args.node_setup,
                        args.ray_wait_s, args.sbatch_args)
    submit(req, args.dry_run)


def _write_rows(args) -> None:
    import transformers

    from megatron_rl.data.remote_rows import write_rows

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    counts = write_rows(args.url, args.out_dir, tokenizer, args.token_env, args.max_prompt_length, f".{args.format}")
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))


def _serve_envs(args) -> None:
    from megatron_rl.env_vars import secret
    from megatron_rl.envs.remote.server import ServerConfig, serve

    token = secret(args.token_env) if args.token_env else None
    if args.token_env and token is None:
        raise ValueError(f"--token-env {args.token_env}: that environment variable is not set")
    serve(ServerConfig(args.bundle, args.host, args.port, token, args.max_concurrent, args.max_wait_s))


def _serve(args) -> None:
    from megatron_rl.config import load_config
    from megatron_rl.inference.serve import serve
    from megatron_rl.preflight import check_serve

    overrides = [f"model.path={w[6:]}" if w.startswith("model=") else w for w in args.overrides]
    cfg = load_config(overrides)
    check_serve(cfg)
    serve(cfg, args.host, args.port)


def _serve_training(args) -> None:
    try:
        import tinker.proto  # noqa: F401  (the wire format the service decodes)
    except ImportError as err:
        raise ValueError("serve-training needs the tinker SDK's wire definitions: "
                         "pip install -e '.[tinker]' (tinker==0.38.0)") from err
    from megatron_rl.tinker.app import run

    run(args.overrides, args.host, args.port, args.lora_as_full_finetune)


def _make_tiny_model(args) -> None:
    from megatron_rl.tiny import make_tiny_model

    print(make_tiny_model(args.arch, args.out, size=args.size, seed=args.seed))


def _config(args) -> None:
    from megatron_rl.config import load_config, to_yaml

    cfg = load_config(args.overrides)
    if args.describe:
        from megatron_rl.config.describe import describe

        print(describe(cfg))
    else:
        print(to_yaml(cfg), end="")


def _plan(args) -> None:
    from megatron_rl.config import load_config
    from megatron_rl.runtime.cluster import parse_cluster
    from megatron_rl.runtime.plan import render

    cluster = [w.split("=", 1)[1] for w in args.overrides if w.startswith("cluster=")] or ["1x8xH100"]
    overrides = [w for w in args.overrides if not w.startswith("cluster=")]
    print(render(load_config(overrides), parse_cluster(cluster[-1])))


def _train(args) -> None:
    from megatron_rl.config import load_config
    from megatron_rl.preflight import check_train

    cfg = load_config(args.overrides)
    check_train(cfg)
    from megatron_rl.schedules.job import train  # heavy (Ray, megatron): imported once the inputs are known good

    print(f"run folder: {train(cfg)}")


COMMANDS = {"make-tiny-model": _make_tiny_model, "train": _train, "config": _config, "serve-envs": _serve_envs,
            "write-rows": _write_rows, "plan": _plan, "serve": _serve, "slurm": _slurm,
            "serve-training": _serve_training}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except ValueError as err:
        if args.verbose:
            raise
        print(f"megatron-rl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"megatron-rl {args.command}: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
