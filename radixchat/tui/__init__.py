"""The terminal chat app (Textual). Talks only to the chat layer and the engine's public API."""
