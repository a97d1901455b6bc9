"""The API reference's pages, one per public package, written from its `__all__`.

Each name is documented once, under the package whose modules define it (a
name re-exported by a higher layer links there), so Sphinx sees no duplicate
object descriptions. A submodule in an `__all__` (`jaxdp.train.presets`) is
documented as a module: its own public names.
"""

import importlib
import inspect
import os

# Lowest layer first (jaxdp's dependencies point accounting <- train <- sweep
# <- tuning <- audit), so a re-exported name is documented where it is defined.
PACKAGES = ("jaxdp", "jaxdp.accounting", "jaxdp.models", "jaxdp.data", "jaxdp.train", "jaxdp.sweep",
            "jaxdp.tuning", "jaxdp.audit")
# Public modules that no `__all__` names but the guides use by their dotted name.
EXTRA_MODULES = {"jaxdp.models": ("jaxdp.models.lora",)}


def public_names(package: str) -> list:
  """The package's `__all__`: what it promises (a package without one fails the build)."""
  module = importlib.import_module(package)
  return list(module.__all__)


def _entry(package: str, name: str, obj) -> list:
  if inspect.ismodule(obj):
    title = obj.__name__
    return ["", title, "-" * len(title), "", f".. automodule:: {title}", "   :members:", "",
            f".. currentmodule:: {package}", ""]
  if inspect.isclass(obj):
    return [f".. autoclass:: {name}", ""]
  if callable(obj):
    return [f".. autofunction:: {name}", ""]
  return [f".. autodata:: {name}", ""]


def _page(package: str, documented: dict) -> str:
  module = importlib.import_module(package)
  names = public_names(package)
  lines = [package, "=" * len(package), "", f".. automodule:: {package}", "   :no-members:", "",
           f".. currentmodule:: {package}", ""]
  own, elsewhere, body = [], [], []
  for name in names:
    obj = getattr(module, name)
    home = documented.get(id(obj))
    if home is not None and not inspect.ismodule(obj):
      elsewhere.append((name, home))
      continue
    documented.setdefault(id(obj), f"{package}.{name}")
    if not inspect.ismodule(obj):
      own.append(name)
    body += _entry(package, name, obj)
  for extra in EXTRA_MODULES.get(package, ()):
    body += _entry(package, extra, importlib.import_module(extra))
  if own:
    lines += [".. autosummary::", ""] + [f"   {n}" for n in own] + [""]
  if elsewhere:
    lines += ["Also exported here: " + ", ".join(f":obj:`{n} <{home}>`" for n, home in elsewhere) + ".", ""]
  return "\n".join(lines + body)


def write_api_pages(out_dir: str) -> list:
  """Writes `<package>.rst` for every package into `out_dir`; returns the file names."""
  os.makedirs(out_dir, exist_ok=True)
  documented, written = {}, []
  for package in PACKAGES:
    path = os.path.join(out_dir, package + ".rst")
    text = _page(package, documented)
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    written.append(package + ".rst")
  return written
