"""The command palette's chat commands (Ctrl+P). Textual's own (themes, keys, quit) stay alongside.

Then one command per preset of the config file (``Preset: NAME``). Each runs an action of the chat screen,
whichever screen the palette was opened on (``app.…`` ones run on the app)."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from radixchat.config import Settings
from radixchat.tui.chat_screen import ChatScreen

# (title, help, action run on the chat screen)
COMMANDS: list[tuple[str, str, str]] = [
    ("Mode: chat", "Free text replies", "set_mode('chat')"),
    ("Mode: json", "Replies constrained to JSON (optionally a schema)", "set_mode('json')"),
    ("Mode: tool", "The model may call the listed tools", "set_mode('tool')"),
    ("Cycle mode", "chat → json → tool", "cycle_mode"),
    ("JSON schema…", "Paste or load the schema for JSON mode", "edit_schema"),
    ("Tools…", "Choose the tools tool mode offers, and tool_choice", "show_tools"),
    ("New chat", "Start a new conversation", "new_chat"),
    ("Regenerate reply", "Generate the last reply again (the old one is kept as a branch)", "regenerate"),
    ("Edit last prompt", "Edit your last message into a new branch", "edit_last"),
    ("Branches…", "Switch between the branches of this conversation", "branches"),
    ("Next branch", "Switch to the next branch", "cycle_branch(1)"),
    ("Previous branch", "Switch to the previous branch", "cycle_branch(-1)"),
    ("Stop reply", "Stop the reply being generated (keeps its text)", "stop"),
    ("Copy last reply", "Copy the last assistant message", "copy_last"),
    ("Save session", "Save the chat (asks for a name the first time)", "save"),
    ("Save session as…", "Save the chat under another name", "save_as"),
    ("Open session…", "Browse, open, rename, delete and export sessions", "sessions"),
    ("Export to Markdown", "Write the chat as a Markdown file next to the session", "export_markdown"),
    ("Session settings…", "System prompt and sampling parameters", "settings"),
    ("Switch model…", "Continue this chat on another model (bundled, models_dir, recent)", "app.pick_model"),
    ("Attach file…", "Pick a file to attach to the message (@path in the prompt)", "attach_file"),
    ("Toggle panels", "Show or hide the cache tree, hit rate, memory and speed panels", "toggle_panels"),
    ("Show/hide thinking", "Unfold or fold every reply's thinking (thinking models)", "app.toggle_thinking"),
    ("Help", "All key bindings", "app.help"),
]


def preset_commands(settings: Settings) -> list[tuple[str, str, str]]:
    """One command per ``[presets.NAME]`` of the config file."""
    return [
        (
            f"Preset: {name}",
            p.description or "System prompt, sampling and mode of this preset",
            f"apply_preset({name!r})",
        )
        for name, p in sorted(settings.presets.items())
    ]


class ChatCommands(Provider):
    def _chat(self) -> ChatScreen:
        return next(s for s in self.app.screen_stack if isinstance(s, ChatScreen))

    def _run(self, action: str) -> partial[object]:
        return partial(self.app.run_action, action, self._chat())

    def _commands(self) -> list[tuple[str, str, str]]:
        return COMMANDS + preset_commands(self._chat().core.settings)

    async def discover(self) -> Hits:
        for title, help_text, action in self._commands():
            yield DiscoveryHit(title, self._run(action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), self._run(action), help=help_text)
