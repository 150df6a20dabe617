import sys

try:
    from gnnpar.cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C before main() could catch it (while importing)
    print("gnnpar: interrupted", file=sys.stderr)
    code = 130
sys.exit(code)
