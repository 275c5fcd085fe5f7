"""The chat app's screens and dialogs, each with its own .tcss."""
