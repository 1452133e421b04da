"""The chart's ValidatingAdmissionPolicy (issue 29: annotations only the scheduler writes): rendered by
real Helm, its CEL evaluated by cel-python as the API server would evaluate it (request, object,
oldObject; the variables in order; the match condition, then the validation), on the requests the webhook
refuses and admits (pyvgpu.cluster.scheduler.webhook.forged_annotations): the two agree."""

from __future__ import annotations

import pytest
from test_cluster_chart import NS, ChartError, by_kind, render

from pyvgpu.cluster.scheduler.webhook import ALLOCATION_KEYS, forged_annotations

celpy = pytest.importorskip("celpy", reason="the test extra installs cel-python")

SCHED = f"system:serviceaccount:{NS}:rel-pyvgpu-scheduler"
NODE = f"system:serviceaccount:{NS}:rel-pyvgpu-node"
WRITERS = frozenset({SCHED, NODE})


def _policy(values: dict | None = None, extra: tuple[str, ...] = ()) -> tuple[dict, dict] | None:
    docs = render(values, extra=extra)
    pols, binds = by_kind(docs, "ValidatingAdmissionPolicy"), by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert len(pols) == len(binds) <= 1
    return (pols[0], binds[0]) if pols else None


def _admits(policy: dict, req: dict) -> bool:
    """What the API server answers for this admission request: True to admit."""
    env = celpy.Environment()
    spec = policy["spec"]
    request = celpy.json_to_cel({"userInfo": req.get("userInfo") or {}, "operation": req["operation"]})
    act = {"request": request, "object": celpy.json_to_cel(req["object"]),
           "oldObject": celpy.json_to_cel(req.get("oldObject"))}
    for cond in spec.get("matchConditions", []):
        if not env.program(env.compile(cond["expression"])).evaluate(act):
            return True  # not matched: the policy does not apply
    variables: dict = {}
    for v in spec.get("variables", []):
        act["variables"] = celpy.json_to_cel(variables) if variables else celpy.celtypes.MapType({})
        got = env.program(env.compile(v["expression"])).evaluate(act)
        variables[v["name"]] = got
    act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    return all(bool(env.program(env.compile(x["expression"])).evaluate(act)) for x in spec["validations"])


def _pod(annos: dict | None) -> dict:
    meta = {"name": "p", "namespace": "ml"}
    if annos is not None:
        meta["annotations"] = annos
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "c"}]}}


ALLOCATED = "GPU-a,NVIDIA,1024,0:;"
CASES = [  # (operation, user, new annotations, old annotations)
    ("CREATE", "alice", None, None),
    ("CREATE", "alice", {"hami.io/gpu-scheduler-policy": "binpack"}, None),
    ("CREATE", "alice", {"hami.io/vgpu-devices-allocated": ALLOCATED}, None),
    ("CREATE", "alice", {"hami.io/bind-phase": ""}, None),
    ("CREATE", SCHED, {"hami.io/vgpu-node": "n1"}, None),
    ("UPDATE", "alice", {"hami.io/vgpu-node": "n1", "x": "y"}, {"hami.io/vgpu-node": "n1"}),
    ("UPDATE", "alice", {"hami.io/vgpu-node": "n2"}, {"hami.io/vgpu-node": "n1"}),
    ("UPDATE", "alice", {}, {"hami.io/bind-phase": "allocating"}),
    ("UPDATE", "alice", None, {"hami.io/bind-time": "1"}),
    ("UPDATE", NODE, {"hami.io/bind-phase": "success"}, {"hami.io/bind-phase": "allocating"}),
    ("UPDATE", SCHED, {"hami.io/vgpu-devices-to-allocate": ALLOCATED}, {}),
    ("UPDATE", "system:serviceaccount:other:rel-pyvgpu-scheduler", {"hami.io/vgpu-node": "n1"}, {}),
]


@pytest.mark.parametrize("op, user, new, old", CASES)
def test_the_policy_decides_as_the_webhook(op, user, new, old):
    policy, binding = _policy()
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    req = {"operation": op, "userInfo": {"username": user}, "object": _pod(new),
           "oldObject": _pod(old) if op == "UPDATE" else None}
    webhook_admits = forged_annotations(req, WRITERS) is None
    assert _admits(policy, req) == webhook_admits


def test_the_policy_names_the_webhooks_keys_and_fails_closed():
    policy, _ = _policy()
    keys_expr = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "keys")
    env = celpy.Environment()
    assert list(env.program(env.compile(keys_expr)).evaluate({})) == list(ALLOCATION_KEYS)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert "namespaceSelector" not in policy["spec"]["matchConstraints"]  # every namespace


def test_rendered_where_the_cluster_serves_it_unless_told():
    assert _policy(extra=("--kube-version", "1.29.0")) is None  # auto: admissionregistration.k8s.io/v1 is 1.30+
    assert _policy({"admissionPolicy": {"enabled": False}}) is None
    assert _policy({"admissionPolicy": {"enabled": True}}) is not None
    with pytest.raises(ChartError, match="needs Kubernetes 1.30"):
        _policy({"admissionPolicy": {"enabled": True}}, extra=("--kube-version", "1.29.0"))
    with pytest.raises(ChartError):
        _policy({"admissionPolicy": {"enabled": "sometimes"}})
