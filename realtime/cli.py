"""``realtime serve``: start the server on the built-in models."""

from __future__ import annotations

import argparse
import logging
import sys

from realtime.config import EngineConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="realtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve world, policy and tts sessions over WebSockets")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--models", default="maze,tiny",
                       help="world models to load, comma-separated; the first is the default (maze, tiny)")
    serve.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    serve.add_argument("--max-batch", type=int, default=32, help="most world ticks batched into one forward")
    serve.add_argument("--frames-per-chunk", type=int, default=1)
    serve.add_argument("--steps", type=int, default=None, help="denoising steps per frame (maze)")
    serve.add_argument("--policy", default="default",
                       help="robot policy: 'default', 'dummy', 'module:factory', or '' to disable")
    serve.add_argument("--no-tts", action="store_true", help="do not load the TTS voice")
    serve.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return ServerConfig(
        host=args.host,
        port=args.port,
        engine=EngineConfig(device=device),
        world=WorldConfig(models=tuple(m for m in args.models.split(",") if m), max_batch=args.max_batch,
                          frames_per_chunk=args.frames_per_chunk, steps=args.steps),
        policy=PolicyConfig(policy=args.policy),
        tts=TTSConfig(enabled=not args.no_tts),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    from realtime.app import build_app
    from realtime.server import run

    run(build_app(config), host=config.host, port=config.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
