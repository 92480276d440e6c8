"""A robot that speaks RoboArena's client protocol, as its ``WebsocketClientPolicy`` does
(robo-arena/roboarena ``policy_client.py``; DreamZero's ``eval_utils/policy_client.py`` and
the RoboArena evaluator's ``websocket_client_policy.py`` behave the same):

* connect with ``compression=None, max_size=None`` and read one frame, the server config;
* ``infer(obs)``: add ``endpoint: "infer"``, send, read one frame; a text frame is raised as
  ``RuntimeError("Error in inference server:\\n" + text)``, bytes are unpacked;
* ``reset(reset_info)``: add ``endpoint: "reset"``, send, return the frame read as it is.

Written from that behaviour, with openpi-client's msgpack-numpy (the one those clients import).
"""

from __future__ import annotations

from typing import Any

import websockets.sync.client
from openpi_client import msgpack_numpy


class RoboArenaClient:
    def __init__(self, uri: str) -> None:
        self._packer = msgpack_numpy.Packer()
        # legacy=True: RoboArena's clients call connect() outside a context manager, which
        # websockets 17.1 deprecates; this says so instead of warning.
        self._ws = websockets.sync.client.connect(uri, compression=None, max_size=None, legacy=True)
        self._config = msgpack_numpy.unpackb(self._ws.recv())

    def get_server_metadata(self) -> dict[str, Any]:
        return self._config

    def infer(self, obs: dict[str, Any]) -> Any:
        obs["endpoint"] = "infer"
        self._ws.send(self._packer.pack(obs))
        response = self._ws.recv()
        if isinstance(response, str):
            raise RuntimeError(f"Error in inference server:\n{response}")
        return msgpack_numpy.unpackb(response)

    def reset(self, reset_info: dict[str, Any]) -> Any:
        reset_info["endpoint"] = "reset"
        self._ws.send(self._packer.pack(reset_info))
        return self._ws.recv()

    def close(self) -> None:
        self._ws.close()
