"""`python -m sglang_obs.generate [--check] [PRODUCT ...]` (`make generate`): the one command that
writes the committed generated files, and the one that checks them (--check writes nothing and
exits 1 listing what is stale, missing or left over).

Products run in dependency order (the Kubernetes objects translate the rules and dashboards, the
README quotes the example pack). Without PRODUCT every product runs; `--list` names them.
"""

from __future__ import annotations

import argparse
import sys

from sglang_obs.core import settings
from sglang_obs.generate import products


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_obs.generate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated file is stale")
    parser.add_argument("--list", action="store_true", help="name the products and exit")
    parser.add_argument("products", nargs="*", metavar="PRODUCT",
                        help=f"only these ({', '.join(products.NAMES)})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for product in products.PRODUCTS:
            print(f"{product.name}: {product.what}")
        return 0
    unknown = [n for n in args.products if n not in products.NAMES]
    if unknown:
        parser.error(f"unknown product {', '.join(unknown)} (known: {', '.join(products.NAMES)})")
    chosen = [p for p in products.PRODUCTS if not args.products or p.name in args.products]
    try:
        s = settings.load()
    except settings.SettingsError as err:
        print(f"python -m sglang_obs.generate: {err}", file=sys.stderr)
        return 1
    return products.run(chosen, args.check, s)


if __name__ == "__main__":
    raise SystemExit(main())
