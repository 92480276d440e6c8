"""``realtime serve``: start the server on the built-in models."""

from __future__ import annotations

import argparse
import logging
import sys

from models.factory import DEFAULT_WORLDS, DEFAULTS, FACTORIES, FactoryError, kind_of, parse_entries
from realtime.config import EngineConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="realtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve world, policy and tts sessions over WebSockets")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--models", default=",".join(DEFAULT_WORLDS),
                       help="models to load, comma-separated 'name' or 'name=path' entries of the factory table "
                            f"(models/factory.py: {', '.join(sorted(FACTORIES))}); world entries in order, the "
                            "first is the default world; a policy or voice entry here replaces --policy / the "
                            "default voice")
    serve.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    serve.add_argument("--max-batch", type=int, default=32, help="most world ticks batched into one forward")
    serve.add_argument("--frames-per-chunk", type=int, default=1)
    serve.add_argument("--steps", type=int, default=None, help="denoising steps per frame (maze)")
    serve.add_argument("--policy", default=None,
                       help=f"robot policy: 'default' ({DEFAULTS['policy']}), a table policy "
                            f"({', '.join(_names('policy'))}, as 'name' or 'name=path'), a user policy "
                            "'module:factory', or '' to disable (default: default)")
    serve.add_argument("--no-tts", action="store_true", help="do not load the TTS voice")
    serve.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def _names(kind: str) -> list[str]:
    return sorted(name for name, (k, _) in FACTORIES.items() if k == kind)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The config the arguments ask for; ``FactoryError`` for an entry the table does not know."""
    worlds, policy, voice = _split_models(args.models, args.policy)
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return ServerConfig(
        host=args.host,
        port=args.port,
        engine=EngineConfig(device=device),
        world=WorldConfig(models=worlds, max_batch=args.max_batch, frames_per_chunk=args.frames_per_chunk,
                          steps=args.steps),
        policy=PolicyConfig(policy=policy),
        tts=TTSConfig(enabled=not args.no_tts, voice=voice),
    )


def _split_models(models: str, policy: str | None) -> tuple[tuple[str, ...], str, str]:
    """``--models`` entries by kind (the table says which): worlds, the policy, the voice."""
    worlds: list[str] = []
    policies: list[str] = []
    voices: list[str] = []
    for entry in parse_entries(models):
        {"world": worlds, "policy": policies, "tts": voices}[kind_of(entry.name)].append(str(entry))
    if len(policies) > 1 or len(voices) > 1:
        raise FactoryError(f"--models names more than one policy or voice: {policies + voices}")
    if policies and policy is not None:
        raise FactoryError(f"--models names the policy {policies[0]!r}; drop --policy {policy!r}")
    chosen = policies[0] if policies else ("default" if policy is None else policy)
    return tuple(worlds), chosen, voices[0] if voices else ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from realtime.app import build_app
    from realtime.server import run

    try:
        config = config_from_args(args)
        app = build_app(config)
    except FactoryError as exc:
        print(f"realtime serve: {exc}", file=sys.stderr)
        return 2
    run(app, host=config.host, port=config.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
