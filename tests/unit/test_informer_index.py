"""The informer's indexes (kube/informer.py): an object filed under the values its index
function gives, refiled on every update, unfiled on delete, rebuilt on a re-list. Driven
through the store's own entry points (a LIST's items, a WATCH's events): no server needed."""

from __future__ import annotations

from fabricdra.api.jsontypes import JSON
from fabricdra.kube.informer import Informer, without_managed_fields
from fabricdra.kube.rest import CLAIMS, Rest


def _claim(name: str, *nodes: str, domain: str = "", rv: str = "1") -> JSON:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "labels": {"domain": domain} if domain else {},
        },
        "status": {"nodes": list(nodes)},
    }


def _informer() -> Informer:
    informer = Informer(Rest(None), CLAIMS)
    informer.add_index("node", lambda o: o.get("status", {}).get("nodes", []))
    informer.add_index("domain", lambda o: [o["metadata"]["labels"].get("domain", "")])
    return informer


def _names(objs: list[JSON]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def test_a_listing_files_every_object_under_each_value() -> None:
    informer = _informer()
    informer._replace_all([_claim("a", "n1", "n2", domain="d1"), _claim("b", "n2")])
    assert _names(informer.by_index("node", "n1")) == ["a"]
    assert _names(informer.by_index("node", "n2")) == ["a", "b"]
    assert _names(informer.by_index("domain", "d1")) == ["a"]
    assert informer.by_index("domain", "") == []  # an empty value files nothing
    assert informer.by_index("node", "n9") == []
    assert informer.index_values("node") == {"n1": 1, "n2": 2}


def test_an_update_moves_the_object_and_a_delete_unfiles_it() -> None:
    informer = _informer()
    informer._replace_all([_claim("a", "n1", domain="d1")])
    old, new = informer._apply("MODIFIED", _claim("a", "n2", domain="d2", rv="2"))
    assert old is not None
    assert new is not None
    assert old["metadata"]["resourceVersion"] == "1"
    assert informer.by_index("node", "n1") == []  # left its old value
    assert _names(informer.by_index("node", "n2")) == ["a"]
    assert informer.index_values("domain") == {"d2": 1}  # empty buckets do not linger
    informer._apply("DELETED", _claim("a", "n2", domain="d2", rv="3"))
    assert informer.by_index("node", "n2") == []
    assert informer.index_values("node") == {}
    assert len(informer) == 0


def test_a_relist_rebuilds_the_indexes() -> None:
    """A re-list (after a 410) replaces the store: objects gone from it leave the indexes too."""
    informer = _informer()
    informer._replace_all([_claim("a", "n1"), _claim("b", "n1")])
    informer._apply("ADDED", _claim("c", "n3"))
    informer._replace_all([_claim("b", "n2")])
    assert informer.by_index("node", "n1") == []
    assert informer.by_index("node", "n3") == []
    assert _names(informer.by_index("node", "n2")) == ["b"]


def test_an_index_added_late_files_what_is_cached() -> None:
    informer = Informer(Rest(None), CLAIMS)
    informer._replace_all([_claim("a", "n1")])
    informer.add_index("node", lambda o: o.get("status", {}).get("nodes", []))
    assert _names(informer.by_index("node", "n1")) == ["a"]


def test_reads_count_the_objects_handed_out() -> None:
    """What a reconcile visited: an index lookup hands out its bucket, not the cache."""
    informer = _informer()
    informer._replace_all([_claim(f"c{i}", f"n{i}") for i in range(100)])
    before = informer.reads
    informer.by_index("node", "n7")
    assert informer.reads - before == 1
    informer.items()
    assert informer.reads - before == 101


def test_managed_fields_are_not_kept() -> None:
    informer = Informer(Rest(None), CLAIMS, transform=without_managed_fields)
    body = _claim("a", "n1")
    body["metadata"]["managedFields"] = [{"manager": "kube-scheduler", "fieldsV1": {}}]
    informer._replace_all([body])
    informer._apply("MODIFIED", {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}})
    stored = informer.get("ns/a")
    assert stored is not None
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["resourceVersion"] == "2"
    assert "managedFields" in body["metadata"]  # the caller's object is left as it was
