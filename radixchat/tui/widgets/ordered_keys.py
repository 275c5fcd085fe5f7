"""Text boxes for the dialogs whose bound keys act in the order the keys arrive, as the prompt's do.

Left to Textual, a priority binding (a dialog's Ctrl+S) runs when the App first sees the key, before the
characters typed just ahead of it have reached the box (the schema applied was cut short, the settings
closed without the value); a plain binding runs once the key has bubbled up to the App, while the box
goes on with the keys behind it (a Backspace lands after the characters that followed it, characters
typed after Ctrl+S land in the value applied). Keys arrive in such bursts from fast typing, tmux
send-keys, or a paste without bracketed paste. So these boxes run their own bindings and those of the
containers up to their screen (a dialog's Ctrl+S and Esc) from ``_on_key``, in order with the characters
they insert; the dialogs' bindings are plain ones. The prompt (``PromptInput``) is such a box too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events
from textual.binding import Binding, BindingsMap
from textual.dom import DOMNode
from textual.widget import Widget
from textual.widgets import Input, TextArea

# A plain mixin at run time: Textual takes a widget's CSS type names (and default CSS) from its first
# DOMNode base only, so a Widget here would hide TextArea's and Input's.
MixinBase = Widget if TYPE_CHECKING else object


class OrderedKeys(MixinBase):  # type: ignore[misc,valid-type]
    """Mixin for a text widget (before the widget class in the bases)."""

    async def _on_key(self, event: events.Key) -> None:
        for namespace, binding in self._bindings_in_order(event.key, event.character):
            if await self.app.run_action(binding.action, namespace):
                event.stop()
                event.prevent_default()  # the text widget's own key handling does not run
                return

    def _bindings_in_order(self, key: str, character: str | None) -> list[tuple[DOMNode, Binding]]:
        """The non-priority bindings for ``key`` from this widget up to its (modal) screen, as Textual
        looks them up: the user's keymap applied, a printable key this widget takes left to it."""
        keymap = getattr(self.app, "keymap", None)  # ``RadixChatApp.keymap``; another app has none
        consumed = self.check_consume_key(key, character)
        found: list[tuple[DOMNode, Binding]] = []
        node: DOMNode
        for node in self.ancestors_with_self:
            if node is self or not consumed:
                bindings: BindingsMap = node._bindings.copy()
                if keymap:
                    bindings.apply_keymap(keymap)
                # A class's own bindings before those it inherits (the prompt's Up before TextArea's).
                own = {b.id for b in type(node).__dict__.get("BINDINGS", ()) if isinstance(b, Binding)}
                keyed = sorted(bindings.key_to_bindings.get(key, []), key=lambda b: b.id not in own)
                found += [(node, b) for b in keyed if not b.priority]
            if node.is_modal:
                break
        return found


class OrderedTextArea(OrderedKeys, TextArea):
    def check_consume_key(self, key: str, character: str | None = None) -> bool:
        # Enter inserts a newline (TextArea's _on_key does it), whatever the screen binds it to.
        return super().check_consume_key(key, character) or (key == "enter" and not self.read_only)


class OrderedInput(OrderedKeys, Input):
    pass
