import sys

# TODO: parse command line flags
def main():
    args = sys.argv[1:]
    # todo (lowercase) is not a marker
    return run(args)  # TODO handle errors


def run(args):
    return 0
