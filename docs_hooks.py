"""MkDocs hook: every page under docs/ that the nav of mkdocs.yml does not list is added under
"More", so a page written later is on the site without editing the nav."""

from __future__ import annotations


def on_nav(nav, config, files):  # noqa: ARG001 - MkDocs' hook signature
    from mkdocs.structure.nav import Section
    from mkdocs.structure.pages import Page

    listed = {p.file.src_uri for p in nav.pages}
    extra = [f for f in files.documentation_pages() if f.src_uri not in listed]
    if not extra:
        return nav
    pages = [Page(None, f, config) for f in sorted(extra, key=lambda f: f.src_uri)]
    section = Section("More", pages)
    for p in pages:
        p.parent = section
    nav.items.append(section)
    nav.pages.extend(pages)
    return nav
