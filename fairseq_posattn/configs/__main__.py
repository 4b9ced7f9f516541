"""``python -m fairseq_posattn.configs``: where the shipped fairseq-hydra-train configs are, and checks.

    python -m fairseq_posattn.configs               the config directory (--config-dir is a family in it)
    python -m fairseq_posattn.configs --user-dir    the plugin directory (common.user_dir=...)
    python -m fairseq_posattn.configs --list        every config: family/name and what it reproduces
    python -m fairseq_posattn.configs --check [FILE ...]
                                                    check the given configs (default: all shipped ones)
"""

import argparse
import os
import sys
from typing import List, Optional

from fairseq_posattn.configs import ConfigCheckError, check_config, config_dir, describe, plugin_dir, shipped_configs


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_posattn.configs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--user-dir", action="store_true", help="print the plugin directory (common.user_dir)")
    what.add_argument("--list", action="store_true", help="list the shipped configs")
    what.add_argument("--check", nargs="*", metavar="FILE",
                      help="check configs (default: every shipped one); exit status 1 on a problem")
    args = parser.parse_args(argv)
    if args.user_dir:
        print(plugin_dir())
    elif args.list:
        for path in shipped_configs():
            name = os.path.relpath(path, config_dir())[:-len(".yaml")]
            print(f"{name}: {describe(path)}")
    elif args.check is not None:
        return check(args.check or shipped_configs())
    else:
        print(config_dir())
    return 0


def check(paths: List[str]) -> int:
    failed = 0
    for path in paths:
        try:
            check_config(path)
        except ConfigCheckError as e:
            print(e, file=sys.stderr)
            failed += 1
    print(f"{len(paths) - failed} of {len(paths)} configs OK", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
