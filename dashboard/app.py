"""The Streamlit app: ``paretolab dashboard`` runs this file. It reads the stores and never writes them.

Stores come from the arguments after ``--`` (``--home``, ``--storage``, ``--tracking-uri``,
``--address``) or the usual environment variables. The page, study and trial are mirrored in
the URL's query string, so a link opens the same view.
"""

from __future__ import annotations

import sys

import streamlit as st

from paretolab.dashboard import data
from paretolab.dashboard.context import Context, label, parse_args, ray_address, stores_from
from paretolab.dashboard.view_curves import curves_page
from paretolab.dashboard.view_frontier import frontier_page
from paretolab.dashboard.view_studies import (
    cluster_page,
    methods_page,
    no_studies,
    studies_page,
)
from paretolab.dashboard.view_trial import compare_page, trial_page
from paretolab.data.names import printable, twin_of
from paretolab.errors import ConfigError
from paretolab.stores.open import check_readable

PAGES = {
    "Studies": studies_page,
    "Frontier": frontier_page,
    "Trial": trial_page,
    "Compare": compare_page,
    "Curves": curves_page,
    "Methods": methods_page,
    "Cluster": cluster_page,
}
NEEDS_STUDY = ("Frontier", "Trial", "Compare", "Curves")


def _from_url() -> None:
    """On a session's first run, take page, study and trial from the query string."""
    if st.session_state.get("_url_read"):
        return
    st.session_state["_url_read"] = True
    query = st.query_params
    if query.get("page") in PAGES:
        st.session_state["page"] = query["page"]
    if query.get("study"):
        st.session_state["study"] = query["study"]
        st.session_state["_asked_study"] = query["study"]  # checked against the stores once they are read
    trial = query.get("trial", "")
    if trial.isascii() and trial.isdigit():  # "²".isdigit() is True, int("²") raises
        st.session_state["trial"] = int(trial)


def _unknown_study(asked: str | None, names: list[str], stores: object) -> None:
    """A ``?study=`` the stores do not hold is said, with the closest names, before another study is shown."""
    if asked is None or asked in names:
        return
    import difflib

    close = difflib.get_close_matches(asked, names, n=3, cutoff=0.6)
    hint = " Did you mean " + " or ".join(f"'{label(c)}'" for c in close) + "?" if close else ""
    shown = f" Showing '{label(names[0])}' instead; pick another in the sidebar." if names else ""
    st.warning(f"No study '{label(asked)}' in {stores.redacted().optuna_url}.{hint}{shown}")


def main() -> None:
    st.set_page_config(page_title="paretolab", layout="wide")
    _from_url()
    # Under `streamlit run app.py -- ARGS` argv is [app.py, *ARGS]; under AppTest it is the test runner's.
    args = parse_args(sys.argv[1:] if sys.argv and sys.argv[0].endswith("app.py") else [])
    stores = stores_from(args)
    try:
        check_readable(stores)
    except ConfigError as exc:  # the line `paretolab studies` prints for the same store
        st.error(str(exc))
        st.stop()
    studies = data.list_studies(stores.optuna_url)
    names = [s.name for s in studies]

    st.sidebar.title("paretolab")
    page = st.sidebar.radio("page", list(PAGES), key="page")
    study = None
    asked = st.session_state.pop("_asked_study", None)
    if asked is not None and asked not in names and (twin := twin_of(asked, names)) is not None:  # the same name under NFKC
        st.session_state["study"] = asked = twin
    _unknown_study(asked, names, stores)
    if names:
        if st.session_state.get("study") not in names:
            st.session_state["study"] = names[0]
        chosen = st.sidebar.selectbox("study", names, key="study", format_func=printable)  # a name from the store, escaped
        study = next(s for s in studies if s.name == chosen)
    ctx = Context(stores=stores, address=ray_address(args), studies=studies, study=study)

    if page in NEEDS_STUDY and study is None:
        st.header(page)
        no_studies(ctx)
    else:
        PAGES[page](ctx)
    query = {"page": page, **({"study": study.name} if study else {})}
    if page == "Trial" and "trial" in st.session_state:
        query["trial"] = str(st.session_state["trial"])
    if dict(st.query_params) != query:
        st.query_params.from_dict(query)


main()
