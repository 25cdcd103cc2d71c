"""Greetings."""


def say_hello(name):
    """A greeting for name."""
    return f"Hello, {name}!"
