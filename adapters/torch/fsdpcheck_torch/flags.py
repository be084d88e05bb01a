"""Command-line flags shared by every command (a leaf module)."""

from .errors import UsageError


def split_args(argv, own):
    """Separates this command's own flags (own: flag -> takes a value) from
    the run flags, keeping the run flags' order."""
    opts, rest = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in own:
            if own[a]:
                if i + 1 >= len(argv):
                    raise UsageError(f"{a} needs a value")
                opts[a] = argv[i + 1]
                i += 2
            else:
                opts[a] = True
                i += 1
        else:
            rest.append(a)
            i += 1
    return opts, rest
