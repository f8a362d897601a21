"""What both server runners share (``AttachRunner`` for ``tinyllm serve``, ``VllmRunner`` for
vLLM): the completions body a Submit becomes, one-line words for network errors and refusals,
the API key, a workload sent at its arrival times, hanging up a stream, and ``ServerLink``, the
"disconnected" note and reconnect countdown in the same words for both. No torch here.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable

import httpx

from tui.runners.interface import LoadWorkload, RunnerDefaults, Submit

RETRY_S = (0.5, 1, 2, 4, 5)  # backoff between reconnects (then every 5 s)
READ_TIMEOUT_S = 15  # the server sends a line at least every 5 s


def completion_body(cmd: Submit, stream: bool = True) -> dict:
    """An OpenAI completions request for a Submit (token ids when the app tokenized them)."""
    s = cmd.settings.sampling
    body = {
        "prompt": list(cmd.tokens) if cmd.tokens is not None else cmd.prompt,
        "max_tokens": cmd.settings.max_new_tokens,
        "temperature": s.temperature,
        "stream": stream,
    }
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.top_k is not None:
        body["top_k"] = s.top_k
    if not cmd.settings.stop_at_eos:
        body["ignore_eos"] = True
    st = cmd.settings
    extra = {
        "min_p": (s.min_p, 0.0),
        "presence_penalty": (s.presence_penalty, 0.0),
        "frequency_penalty": (s.frequency_penalty, 0.0),
        "repetition_penalty": (s.repetition_penalty, 1.0),
        "seed": (s.seed, None),
        "stop": (list(st.stop), []),
        "stop_token_ids": (list(st.stop_token_ids), []),
        "min_tokens": (st.min_tokens, 0),
        "n": (st.n, 1),
        "priority": (st.priority, 0),
        "user": (st.tenant, ""),
    }
    body.update({k: v for k, (v, off) in extra.items() if v != off})  # only what is set (vLLM takes them all)
    return body


def why(e: Exception) -> str:
    """One line for a connection problem."""
    if isinstance(e, httpx.ConnectError):
        return "cannot connect (is the server running? tinyllm serve prints its URL)"
    if isinstance(e, StopIteration):
        return "the server closed the stream"
    if isinstance(e, json.JSONDecodeError):
        return f"it answered something that is not JSON ({e.msg} at line {e.lineno})"
    if isinstance(e, ValueError):  # ours: a whole sentence already
        return " ".join(str(e).split())
    return " ".join(f"{type(e).__name__}: {e}".split()) if str(e) else type(e).__name__


def reason(e: Exception) -> str:
    """A network error's own words, without the errno (``[Errno 111] Connection refused``)."""
    return re.sub(r"^\[Errno -?\d+\] ", "", str(e)) or type(e).__name__


def server_url(address: str) -> str:
    """A server's address as typed (HOST:PORT, or http:// or https:// and HOST:PORT) as its URL;
    ValueError saying what is wrong with one that is not (a port that is not a number in
    1-65535, no host, another scheme): it was a traceback from deep in the HTTP client."""
    url = address if "://" in address else f"http://{address}"
    expected = "a server's address is http://HOST:PORT or https://HOST:PORT (or HOST:PORT)"
    if url.split("://", 1)[0].lower() not in ("http", "https"):
        raise ValueError(expected)
    try:
        u = httpx.URL(url)
        port = u.port or (443 if u.scheme == "https" else 80)
    except (httpx.InvalidURL, ValueError) as e:
        raise ValueError(f"{e}: {expected}") from None
    if not u.host:
        raise ValueError(f"no host: {expected}")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not in 1-65535: {expected}")
    return url


def not_listening(url: str, timeout: float = 2.0) -> str | None:
    """Why nothing accepts connections at ``url``'s host and port yet (the socket's own words:
    "Connection refused"), or None once something does. A host name that does not resolve is a
    ValueError: no wait brings it up. ``url`` is one ``server_url`` gave."""
    u = httpx.URL(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.host, port), timeout=timeout).close()
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve the host {u.host!r} ({reason(e)})") from None
    except OSError as e:
        return reason(e)
    return None


def quoted(prompt: str, most: int = 40) -> str:
    """A prompt in a message, on one line and cut to ``most`` characters."""
    return json.dumps(prompt if len(prompt) <= most else prompt[: most - 1] + "…", ensure_ascii=False)


def send_workload(cmd: LoadWorkload, submit: Callable[[Submit], None], stop: threading.Event) -> None:
    """Send a workload's requests at their arrival times (on this machine's clock), as text: the
    server tokenizes (a local tokenizer may not be the server's)."""
    t0 = time.monotonic()
    for it in sorted(cmd.items, key=lambda it: it.arrival_s):
        if stop.wait(max(0.0, t0 + it.arrival_s - time.monotonic())):
            return
        submit(Submit(it.prompt, it.settings(cmd.defaults)))


def hang_up(r: httpx.Response) -> None:
    """Close a streaming response so the server sees the client go at once: shut the socket
    down first (closing it from another thread while a read waits on it sends nothing until the
    server writes), then close."""
    try:
        stream = r.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    r.close()


API_KEY_ENVS = ("TINYLLM_API_KEY", "OPENAI_API_KEY")  # where --attach finds a key not given as --api-key


def api_key_for(flag: str | None) -> str | None:
    """The key to send: the given one, else $TINYLLM_API_KEY, else $OPENAI_API_KEY, else None."""
    if flag:
        return flag
    return next((k for e in API_KEY_ENVS if (k := os.environ.get(e))), None)


def refused_key(key: str | None) -> str:
    """One line for a 401 from the server."""
    if key:
        return "the server refused the API key (401): pass its key with --api-key or TINYLLM_API_KEY"
    return "the server needs an API key (401): pass it with --api-key or TINYLLM_API_KEY"


def api_error(r: httpx.Response) -> str:
    """The message of an OpenAI-style error response (or its status line)."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {r.status_code}"


class ServerLink(RunnerDefaults):
    """What both server runners (``AttachRunner``, ``tui.runners.vllm.VllmRunner``) say when the
    server goes away, in the same words: the "disconnected" note, the countdown to the next try,
    and why a request of ours failed. Uses the runner's ``url``, ``status``, ``_stop``, ``_note``
    and ``_publish``."""

    LOST_STATE = "its state is the server's last report"  # a request cut off mid-stream, on screen

    def _count_down(self, wait: float) -> None:
        """Wait ``wait`` s before the next try, the status saying how long is left: republished
        as each second passes, so the screen never shows a wait that is over (the half-second
        wait, and the try itself: "retrying…")."""
        end = time.monotonic() + wait
        while (left := end - time.monotonic()) > 0.01:
            whole = math.ceil(left - 0.01)  # the second it is in (a wait may end a hair early)
            self._publish(f"retry in {whole} s" if left > 0.9 else "retrying…")
            if self._stop.wait(left - whole + 1):
                return

    def _refused(self, cmd: Submit) -> None:
        """The server refused a prompt of ours (a 400: too long for its context, ...): it goes back
        to the app (``take_refused``), whose input was cleared on sending, to be edited."""
        self.__dict__.setdefault("_refused_prompts", []).append(cmd.prompt)

    def take_refused(self) -> list[str]:
        """The prompts refused since the last call (the app puts one back into an empty input)."""
        taken, self._refused_prompts = self.__dict__.get("_refused_prompts", []), []
        return taken

    def _disconnected(self, why: str) -> None:
        first = self.status != "disconnected"
        self.status = "disconnected"
        if first:
            self._note("info", f"disconnected from {self.url} ({why}); retrying")

    def _failed(self, cmd: Submit, rid: int | None, e: Exception) -> str:
        """Why a request of ours failed. One that never reached the server quotes its prompt (the
        app cleared its input on sending); one cut off names its request, whose last state the
        screen keeps until the app reconnects."""
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            return (
                f"{quoted(cmd.prompt)} not sent: the server at {self.url} is not reachable ({reason(e)}); "
                f"retrying the connection, send it again once the status says ATTACHED"
            )
        if rid is not None and isinstance(e, httpx.TransportError):
            return f"#{rid}: the connection to {self.url} was lost mid-stream ({reason(e)}); {self.LOST_STATE}"
        return f"request failed: {why(e)}"
