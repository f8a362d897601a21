"""The app's actions in Textual's command palette (Ctrl+P), each with its keys: a place to find
what the footer has no room for (searching ``race`` found nothing; the palette held only
Textual's own commands)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

# (action, what it does): the palette's order when nothing is typed
PALETTE = (
    ("focus_input", "Type a prompt"),
    ("load_prompts", "Load prompts: a JSONL workload (bundled or a file)"),
    ("race", "Race: static vs continuous batching on the same requests"),
    ("settings", "Settings for the next request (temperature, max tokens, stop...)"),
    ("toggle_pause", "Pause / resume the engine"),
    ("step_once", "Step once (while paused)"),
    ("slower", "Slower: more delay between steps"),
    ("faster", "Faster: less delay between steps"),
    ("toggle_panes", "Panes: every slot's request writing at once / the list view"),
    ("toggle_timeline", "Timeline / requests list"),
    ("zoom_out", "Timeline: more steps per column"),
    ("zoom_in", "Timeline: fewer steps per column"),
    ("focus_log", "Events: scroll the event log back (the last 10,000)"),
    ("recording", "Record this run (--record FILE) / where the recording goes"),
    ("abort_selected", "Abort the selected request"),
    ("abort_all", "Abort all requests"),
    ("clear_prefix_cache", "Clear the prefix cache"),
    ("step_back", "Replay: one step back"),
    ("goto_step", "Replay: go to a step"),
    ("replay_start", "Replay: go to the start"),
    ("replay_end", "Replay: go to the end"),
    ("next_event", "Replay: the selected request's next event"),
    ("prev_event", "Replay: its previous event"),
    ("help", "Help: every key, and how to read the screen"),
)
NO_KEY = {"recording": "at start: tinyllm-tui --record FILE"}


def keys_of(app, action: str) -> str:
    """The keys bound to ``action``, as the footer writes them ("f5 · space")."""
    keys = [k for b in app.BINDINGS if b.action == action for k in b.key.split(",")]
    shown = [app.get_key_display(Binding(k, action)) for k in keys]
    return " · ".join(dict.fromkeys(shown)) or NO_KEY.get(action, "")


class AppCommands(Provider):
    """Every action of the app that applies here (a replay's, a live engine's, a server's), by
    what it does, with its keys."""

    def _commands(self) -> Iterator[tuple[str, str, object]]:
        app = self.app
        if getattr(self.screen, "owns_keys", False):  # the race: its own keys (its footer, F1)
            return
        for action, title in PALETTE:
            if app._applies(action):
                yield title, keys_of(app, action), partial(app.run_action, action)

    async def discover(self) -> Hits:
        for title, keys, run in self._commands():
            yield DiscoveryHit(f"{title}  ({keys})", run, text=title)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, keys, run in self._commands():
            text = f"{title}  ({keys})"
            if (score := matcher.match(text)) > 0:
                yield Hit(score, matcher.highlight(text), run, text=title)
