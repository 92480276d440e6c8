"""``realtime serve``: start the server on the built-in models."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Mapping, MutableMapping

from models.factory import CPU_FORMATS, DEFAULT_WORLDS, DEFAULTS, FACTORIES, FactoryError, kind_of, parse_entries
from realtime.engine.group import EXIT_GROUP_FAILED
from realtime.server import option_types as types
from realtime.server.admin import LOOPBACK
from realtime.server.config import DRAIN_TIMEOUT_S, EngineConfig, LimitsConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.settings import Resolved, SettingsError, render, resolve
from realtime.server.version import package_version

DESCRIPTION = """\
A realtime session server for interactive generative models: world, robot-policy
and speech sessions over WebSockets on one engine. Open http://HOST:PORT/ for the
demo page; the endpoints are /v1/realtime/world, /v1/realtime/robot/openpi and
/v1/realtime/tts (docs/protocols.md)."""

SERVE_EPILOG = """\
examples:
  realtime serve                                  maze and tiny worlds, policy, voice
  realtime serve --host 0.0.0.0 --port 8080       reachable from other machines
  realtime serve --models tiny --policy dummy --no-tts   quick start, no weights
  realtime serve --models 'lingbot=/ckpt?steps=2&reuse_kv=1&fp8=ffn'
                                                  LingBot-World with opt-in shortcuts
  REALTIME_PORT=8080 realtime serve --config serve.toml --print-config
                                                  the settings, and where each came from
  realtime serve --models lingbot=/ckpt --sequence-parallel 4
                                                  each LingBot session over 4 GPUs

settings: every option is also an environment variable REALTIME_<OPTION>
(--max-sessions-per-client: REALTIME_MAX_SESSIONS_PER_CLIENT; a flag such as --no-tts
takes 1/0, true/false or yes/no; REALTIME_API_KEY takes keys separated by commas) and a
key of the --config file (TOML, JSON, or YAML with PyYAML installed; option names with
dashes or underscores). A flag beats the environment, which beats the file, which beats
the default. An unknown REALTIME_* variable or file key stops the server.

Ctrl-C (SIGINT) or SIGTERM drains the server and exits with status 0; a second Ctrl-C
exits at once with status 130."""

# Options that only a flag gives (not the environment nor the file), and those whose values
# are never printed (--print-config, errors).
FLAG_ONLY = ("print_config",)
SECRET = ("api_key",)


# torch's OpenMP (libgomp on Linux) makes a thread that waits at the end of a parallel op
# spin up to 300,000 rounds before it sleeps. A served model shares the cores with the event
# loop, the frame encoder and often the client (a browser on a laptop): whenever one of them
# preempts a team thread, its partner spins at every one of the ~1,000 barriers of a maze
# tick. On the 2 shared cores of the dev box (load 15-18) the bare CPU maze tick (1 step, 2
# threads) took 0.20 / 0.91 s passive, 3.4 / 2.9 s with GOMP_SPINCOUNT=10000, and the spinning
# default did not get through loading and 12 ticks in 120 s (bench/results/maze_omp_wait_cpu.json).
# Passive unless the caller chose. (The models are also built on a thread that ends,
# realtime.server.inventory.on_spent_thread, so the engine's OpenMP team is the only one: with two
# teams libgomp cuts any spin count to 100 and wakes a sleeping worker at nearly every op.)
# A passive team pays a futex wake-up at every parallel op, which for these small models
# costs more than a second thread gives: one intra-op thread as well. On a quiet 2-core Xeon,
# in one run, the served maze world gave one session 12.2 frames/s and four 3.8 each with one
# thread, against 6.2 and 2.8 with two passive ones (bench/results/maze_serve_cpu_threads.json).
# CPU-dependent: on an AVX2-only EPYC one thread measured slower than two passive ones (maze
# MODEL_CARD.md); OMP_NUM_THREADS=2 gives two back. The other cores still work: a model may split its batch across them, a thread per core with
# one intra-op thread each (models/cpu_lanes.py; the maze world's four sessions 232 -> 124 ms a
# tick on 2 cores). Dedicated cores: try OMP_WAIT_POLICY=ACTIVE or GOMP_SPINCOUNT=300000 with
# OMP_NUM_THREADS at the core count.
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def openmp_defaults(env: MutableMapping[str, str]) -> None:
    """Set ``OPENMP_DEFAULTS`` in ``env`` unless it sets a wait policy or a thread count
    of its own (then the caller has chosen; nothing is added).

    libgomp and torch read these when they load: call before torch is imported."""
    if not any(k in env for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")):
        env.update(OPENMP_DEFAULTS)


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """The keys of --api-key and --api-key-file together, each once, in order;
    ``FactoryError`` for one no header could carry (the message never quotes it)."""
    from realtime.server.auth import check_keys

    keys = [*(args.api_key or ()), *(args.api_key_file.keys if args.api_key_file else ())]
    try:
        return check_keys(dict.fromkeys(keys))
    except ValueError as exc:
        raise FactoryError(f"--api-key: {exc}") from None


def _gib(value: float | None) -> int | None:
    return None if value is None else int(value * (1 << 30))


def _ticks_in_flight(choice: str) -> dict[str, int | None]:
    """``--ticks-in-flight`` as WorldConfig fields (``auto``: WorldConfig's defaults)."""
    if choice == "auto":
        return {}
    return {"session_ticks_in_flight": int(choice), "session_ticks_in_flight_alone": None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="realtime", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve world, policy and tts sessions over WebSockets",
                           description=DESCRIPTION, epilog=SERVE_EPILOG,
                           formatter_class=_Formatter)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on; 0.0.0.0 (or ::) for every interface")
    serve.add_argument("--port", type=types.port, default=8000, help="TCP port to listen on")
    serve.add_argument("--models", default=",".join(DEFAULT_WORLDS),
                       help="models to load, comma-separated 'name' or 'name=path' entries of the factory table "
                            f"(models/factory.py: {', '.join(sorted(FACTORIES))}); world entries in order, the "
                            "first is the default world; a policy or voice entry here takes the place of the policy "
                            "option / the default voice. lingbot takes opt-in shortcuts after its checkpoint folder as "
                            "'lingbot=DIR?key=value&...' (quote it for the shell): steps=1..4 (denoising passes per "
                            "block, default 4), reuse_kv=1 (the last denoising pass writes the block's K/V instead of "
                            "a committing pass), fp8=ffn|attn|cross|all or groups joined by '+' (e4m3 linear layers, "
                            "per-row scales), decoder=wan|taehv:PATH (a taew2_1 state dict); each changes the frames "
                            "(models/world/lingbot/MODEL_CARD.md: how, and how far from the exact path); size=HxW "
                            "(frame size, default 480x832); a bad one stops the server at start")
    serve.add_argument("--device", type=types.device, default="auto", help="cpu, cuda or auto (cuda when available)")
    serve.add_argument("--max-batch", type=types.at_least_one, default=32, help="most world ticks batched into one forward")
    serve.add_argument("--ticks-in-flight", choices=("1", "2", "auto"), default="auto",
                       help="world ticks a session may have queued in the engine at once: 2 queues the next "
                            "tick while one runs, so the engine never waits for the event loop (throughput), "
                            "at one more chunk of input latency; 1 builds each tick after the last committed; "
                            "auto (the default) is 2 while other world sessions share the server and 1 for a "
                            "session alone")
    serve.add_argument("--frames-per-chunk", type=types.at_least_one, default=None,
                       help="frames a world session gets per tick (chunk); held keys apply per frame; maze and "
                            "tiny make 1, lingbot one 12-frame block (default: the model's own)")
    serve.add_argument("--steps", type=types.at_least_one, default=None,
                       help="denoising steps per frame (maze; default: 4 on CUDA, 2 on CPU); lingbot takes its "
                            "steps in its entry (lingbot=DIR?steps=N)")
    serve.add_argument("--cpu-format", choices=("auto",) + tuple(CPU_FORMATS), default="auto",
                       help="number format of the CPU models' products (maze, voice): auto (the default) keeps "
                            "float32 unless this CPU has native bf16 and a pass timed at start is faster in "
                            "bfloat16; the model cards say what bfloat16 changes")
    serve.add_argument("--gpu-memory-fraction", type=types.fraction, default=0.9,
                       help="world models size their KV pool to this fraction of the device's free memory "
                            "(measured after the weights load); a session that does not fit is refused "
                            "at session.create with 'busy'")
    serve.add_argument("--kv-budget-gib", type=types.positive, default=None,
                       help="a fixed KV budget per world model in GiB instead of the fraction of free memory "
                            "(on any device; on CPU the default is no limit)")
    serve.add_argument("--kv-host-gib", type=types.non_negative, default=None,
                       help="host memory per world model for idle sessions' KV swapped out of the pool "
                            "(default: the model's own); when it is full too, new sessions get 'busy'")
    serve.add_argument("--sequence-parallel", type=types.at_least_one, default=1, metavar="N",
                       help="split each world session over N processes (GPUs) of this host, Ulysses sequence parallel, "
                            "for the models that support it (lingbot: its attention heads must divide by N); ranks "
                            "1..N-1 start with the server (or run N under torchrun --nproc-per-node N); a rank that dies or "
                            f"hangs fails every session and the server exits {EXIT_GROUP_FAILED} (docs/sequence_parallel.md)")
    serve.add_argument("--trajectory-root", type=types.directory, default=None, metavar="DIR",
                       help="trusted folder of named camera trajectories (DIR/NAME/poses.npy and "
                            "intrinsics.npy) for world models that play them")
    serve.add_argument("--policy", default=None,
                       help=f"robot policy: 'default' ({DEFAULTS['policy']}), a table policy "
                            f"({', '.join(_names('policy'))}, as 'name' or 'name=path'), a user policy "
                            "'module:factory', or '' to disable (default: default)")
    serve.add_argument("--no-tts", action="store_true", help="do not load the TTS voice")
    serve.add_argument("--allowed-origins", type=types.origins, default=ServerConfig.allowed_origins,
                       metavar="ORIGINS",
                       help="comma-separated browser origins (scheme://host[:port]) that may open "
                            "WebSockets besides the server's own page; 'loopback' allows any "
                            "localhost port, '*' any origin; clients that send no Origin "
                            "(Python, robots) are always allowed")
    serve.add_argument("--admin-from", type=types.admin_addresses, default=(LOOPBACK,), metavar="ADDRESSES",
                       help="comma-separated client addresses or networks (10.0.0.0/8) that may list and "
                            "close sessions (GET /v1/sessions, DELETE /v1/sessions/KIND/ID); 'loopback' "
                            "(default) or '*' for anyone")
    serve.add_argument("--idle-timeout-s", type=types.non_negative, default=LimitsConfig.idle_timeout_s,
                       metavar="SECONDS",
                       help="close a session whose client sent nothing and took nothing this long (world: no "
                            "message and no chunk sent; tts: no message and nothing spoken; OpenPI: no request): "
                            "error 'idle_timeout', then close 4408; a tick, window or inference in flight is "
                            "never idle; 0 disables")
    serve.add_argument("--max-sessions-per-client", type=types.count, default=LimitsConfig.max_sessions_per_client,
                       metavar="N",
                       help="live sessions one client address may hold across kinds (a world session, a tts or "
                            "OpenPI connection each count one); more get 'too_many_sessions' (tts and OpenPI: "
                            "then close 1013); 0: no limit")
    serve.add_argument("--forwarded-allow-ips", type=types.addresses, default=ServerConfig.forwarded_allow_ips,
                       metavar="ADDRESSES",
                       help="comma-separated proxy addresses or networks whose X-Forwarded-For names the client "
                            "(for the per-client limit and the admin check); the default trusts a proxy on this "
                            "host, as deploy/ runs nginx; '*' trusts any peer")
    serve.add_argument("--drain-timeout", type=types.finite_positive, default=DRAIN_TIMEOUT_S, metavar="SECONDS",
                       help="on SIGTERM, how long in-flight work may take to finish before every socket "
                            "is closed with 1001 anyway; the process exits at most 5 s later")
    serve.add_argument("--api-key", action="append", metavar="KEY",
                       help="a key clients must present (docs/protocols.md, Authentication); repeat for "
                            "several; with no key configured, anyone who reaches the port is served. A flag "
                            "shows in ps: prefer --api-key-file or REALTIME_API_KEY")
    serve.add_argument("--api-key-file", type=types.key_file, metavar="PATH",
                       help="more keys, one per line (blank lines and lines starting with # skipped)")
    serve.add_argument("--metrics-require-key", action="store_true",
                       help="/metrics asks for a key too (needs one configured)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="log level of the server and of uvicorn")
    serve.add_argument("--no-access-log", action="store_true",
                       help="no INFO line per HTTP request (health probes stop flooding the log)")
    serve.add_argument("--config", metavar="PATH",
                       help="a TOML, JSON or YAML file of option values (see settings below)")
    serve.add_argument("--print-config", action="store_true",
                       help="print every setting and where it came from, then exit (keys redacted)")
    return parser


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``serve`` subcommand's parser inside ``build_parser()``'s."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def resolve_args(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Resolved:
    """The flags in ``argv`` over the REALTIME_* variables of ``environ`` (default:
    ``os.environ``) over the --config file over the defaults; ``SettingsError`` for a bad
    value from the environment or the file."""
    parser = build_parser()
    return resolve(parser, serve_parser(parser), argv, os.environ if environ is None else environ,
                   config_dest="config", flag_only=FLAG_ONLY, secret=SECRET)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags alone (``resolve_args`` adds the environment and the config file)."""
    return build_parser().parse_args(argv)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every option's help; the description and examples as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):  # "(default: None)" says nothing
            return action.help
        if isinstance(action.default, tuple):
            return f"{action.help} (default: {','.join(action.default)})"
        return super()._get_help_string(action)


def _names(kind: str) -> list[str]:
    return sorted(name for name, (k, _) in FACTORIES.items() if k == kind)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The config the arguments ask for; ``FactoryError`` for an entry the table does not know."""
    worlds, policy, voice = _split_models(args.models, args.policy)
    device = args.device
    if device != "cpu":
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif (not torch.cuda.is_available()
              or torch.device(device).index not in (None, *range(torch.cuda.device_count()))):
            found = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
            raise FactoryError(f"--device {device}: torch {torch.__version__} sees {found} here")
    keys = api_keys(args)
    if args.metrics_require_key and not keys:
        raise FactoryError("--metrics-require-key: no API key is configured "
                           "(--api-key, --api-key-file or REALTIME_API_KEY)")
    return ServerConfig(
        host=args.host,
        port=args.port,
        allowed_origins=args.allowed_origins,
        admin_from=args.admin_from,
        forwarded_allow_ips=args.forwarded_allow_ips,
        limits=LimitsConfig(idle_timeout_s=args.idle_timeout_s, max_sessions_per_client=args.max_sessions_per_client),
        drain_timeout_s=args.drain_timeout,
        api_keys=keys,
        metrics_require_key=args.metrics_require_key,
        engine=EngineConfig(device=device, cpu_format=None if args.cpu_format == "auto" else args.cpu_format),
        world=WorldConfig(models=worlds, max_batch=args.max_batch, frames_per_chunk=args.frames_per_chunk,
                          steps=args.steps, gpu_memory_fraction=args.gpu_memory_fraction,
                          kv_budget_bytes=_gib(args.kv_budget_gib), host_budget_bytes=_gib(args.kv_host_gib),
                          trajectory_root=args.trajectory_root, **_ticks_in_flight(args.ticks_in_flight)),
        policy=PolicyConfig(policy=policy),
        tts=TTSConfig(enabled=not args.no_tts, voice=voice),
    )


def _split_models(models: str, policy: str | None) -> tuple[tuple[str, ...], str, str]:
    """``--models`` entries by kind (the table says which): worlds, the policy, the voice."""
    worlds: list[str] = []
    policies: list[str] = []
    voices: list[str] = []
    entries = parse_entries(models)
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FactoryError(f"--models names {', '.join(twice)} more than once")
    for entry in entries:
        {"world": worlds, "policy": policies, "tts": voices}[kind_of(entry.name)].append(str(entry))
    if len(policies) > 1 or len(voices) > 1:
        raise FactoryError(f"--models names more than one policy or voice: {policies + voices}")
    if policies and policy is not None:
        raise FactoryError(f"--models names the policy {policies[0]!r}; drop --policy {policy!r}")
    chosen = policies[0] if policies else ("default" if policy is None else policy)
    return tuple(worlds), chosen, voices[0] if voices else ""


def main(argv: list[str] | None = None) -> int:
    try:
        resolved = resolve_args(argv)
    except SettingsError as exc:
        print(f"realtime serve: {exc}", file=sys.stderr)
        return 2
    args = resolved.args
    if args.print_config:
        print(render([s for s in resolved.settings if s.dest not in FLAG_ONLY], secret=SECRET))
        return 0
    openmp_defaults(os.environ)  # nothing has imported torch yet
    from realtime.engine.group import launched_rank
    from realtime.server.auth import warn_if_exposed
    from realtime.server.server import bind_socket, configure_logging, run

    launched = launched_rank()
    ranks = launched[1] if launched is not None else args.sequence_parallel
    if ranks != args.sequence_parallel:
        print(f"realtime serve: launched as {ranks} ranks (WORLD_SIZE) with --sequence-parallel "
              f"{args.sequence_parallel}: give the same N to both", file=sys.stderr)
        return 2
    if launched is not None and launched[0] > 0:
        configure_logging(args.log_level)
        return _worker(args)

    # The port first: a busy one is reported now, not after every model has loaded.
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        hint = " (another server running? choose another --port)" if exc.errno == errno.EADDRINUSE else ""
        print(f"realtime serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}{hint}",
              file=sys.stderr)
        return 1
    configure_logging(args.log_level)
    try:
        config = config_from_args(args)
        from realtime.server.app import build_app

        app = build_app(config)
    except FactoryError as exc:
        sock.close()
        print(f"realtime serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the entries are checked: nothing to drain
        print("realtime serve: interrupted at start", file=sys.stderr)
        return 130
    warn_if_exposed(args.host, config.api_keys)
    group = None
    if ranks > 1:  # rank 0 (it starts ranks 1..N-1 unless a launcher did)
        from realtime.engine.group import GroupFailed, start_rank0

        try:
            group = start_rank0(ranks, config.engine.device, None if launched else (argv or sys.argv[1:]))
        except GroupFailed as exc:
            sock.close()
            print(f"realtime serve: {exc}", file=sys.stderr)
            return EXIT_GROUP_FAILED
    try:
        run(app, sock=sock, log_level=args.log_level, access_log=not args.no_access_log)
    finally:
        if group is not None:
            group.stop()
    if group is not None and group.failure is not None:
        print(f"realtime serve: {group.failure}", file=sys.stderr)
        return EXIT_GROUP_FAILED
    failure = app.state.loading.failure if app.state.loading is not None else None
    if failure is not None:  # a model failed to build in the background: the server stopped itself
        print(f"realtime serve: {failure}", file=sys.stderr)
        return 2
    return 0


def _worker(args: argparse.Namespace) -> int:
    """A worker rank: the worlds and the policy rank 0 builds, in its order, then rank 0's calls on them."""
    import dataclasses

    from realtime.engine import serve_worker
    from realtime.server.inventory import load, on_spent_thread, plan

    try:
        config = config_from_args(args)
        models = dataclasses.replace(config, tts=TTSConfig(enabled=False))   # a policy may run split too
        return serve_worker(config.engine.device, lambda device: on_spent_thread(load, plan(dataclasses.replace(
            models, engine=dataclasses.replace(config.engine, device=device)))[0]).adapters)
    except FactoryError as exc:
        print(f"realtime serve: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
