"""Prints a greeting."""

from greetings import say_hello

if __name__ == "__main__":
    print(say_hello("world"))
