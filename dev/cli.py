"""What dev/'s scripts share on the command line: bad input is one line 'error: ...' and a non-zero exit."""
import argparse
import sys


def fail(msg):
    sys.exit(f"error: {msg}")


class Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not the usage and then the message
        fail(f"{message} (see --help)")
