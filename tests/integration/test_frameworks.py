"""The framework layer in-process (issue 17): discovery through real Accelerate wrappers, the
playbook names in eval code, and unwrapping (the HF Trainer, Lightning and FSDP2 run in the
e2e tests, tests/e2e/test_framework_*.py).
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from probe_agent.actions.lr import change_lr  # noqa: E402
from probe_agent.frameworks import discover, unwrap  # noqa: E402
from probe_agent.frameworks.playbook import resolve  # noqa: E402
from probe_agent.operator_code import CodeRun, compile_code, script_namespace  # noqa: E402


def run_code(code: str) -> CodeRun:
    """Eval code as /v1/eval runs it, with this test's frames as the script's."""
    run = CodeRun(10_000)
    run.execute(compile_code(code), session={}, namespace=script_namespace(sys._getframe(1)),
                playbook=resolve)
    return run


def test_an_ambiguous_playbook_name_lists_the_candidates():
    # GIVEN two optimizers and no name `optimizer` in the script
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    opt_body = torch.optim.SGD(net[0].parameters(), lr=0.1)
    opt_head = torch.optim.AdamW(net[1].parameters(), lr=0.01)
    # WHEN eval code uses `optimizer` THEN a one-line NameError lists both
    with pytest.raises(NameError) as e:
        run_code("optimizer.param_groups[0]['lr']")
    assert str(e.value) == (
        "name 'optimizer' is ambiguous: this job has 2: opt_body (SGD), opt_head (AdamW); "
        "pick one first, e.g. optimizer = opt_body")
    # AND `model` is the one root that owns both optimizers' parameters
    assert run_code("type(model).__name__").result == "'Sequential'"
    # AND code that does not use the name runs (an unused name is never looked up)
    assert run_code("1 + 1").result == "2"
    assert opt_body is not opt_head


def test_the_scripts_own_name_wins_over_discovery():
    net = torch.nn.Linear(2, 1)
    other = torch.optim.SGD(net.parameters(), lr=0.1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.003)  # the script's own
    assert run_code("type(optimizer).__name__, optimizer.param_groups[0]['lr']").result == (
        "('AdamW', 0.003)")
    assert other is not optimizer


def test_a_module_under_a_playbook_name_does_not_hide_the_scheduler():
    from torch.optim import lr_scheduler  # what scripts import; not the job's scheduler

    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = lr_scheduler.StepLR(opt, step_size=5)
    opt.step()
    sched.step()
    # the scheduler is found among live objects (gc) as the one of the script's optimizer
    assert run_code("type(lr_scheduler).__name__, lr_scheduler.get_last_lr()").result == (
        "('StepLR', [0.1])")
    assert run_code("scheduler is lr_scheduler").result == "True"


def test_accelerate_loop_discovered_through_its_wrappers_and_lr_holds():
    accelerate = pytest.importorskip("accelerate")
    # GIVEN a plain Accelerate loop: everything went through accelerator.prepare
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    try:
        _accelerate_loop(accelerator)
    finally:  # its state is a process-wide singleton: leave none to later tests
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


def _accelerate_loop(accelerator) -> None:  # noqa: ANN001
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    p_net, p_opt, p_loader, p_sched = accelerator.prepare(
        net, opt, torch.utils.data.DataLoader(data, batch_size=8), sched)

    def step() -> None:
        x, y = next(iter(p_loader))
        accelerator.backward(torch.nn.functional.mse_loss(p_net(x), y))
        p_opt.step()
        p_sched.step()
        p_opt.zero_grad()

    for _ in range(3):
        step()
    # WHEN discovery runs, with the torch optimizer as the one seen stepping
    d = discover(frame=sys._getframe(), optimizers=[opt], fresh=True)
    # THEN the wrappers are off: the objects are those that step
    assert d.framework == "accelerate" and d.trainer is accelerator
    assert type(p_opt).__name__ == "AcceleratedOptimizer" and d.optimizers == [opt]
    assert type(p_sched).__name__ == "AcceleratedScheduler" and d.schedulers == [sched]
    assert [m for _, m in d.models] == [net] and d.train_loader is p_loader
    assert d.name_of(sched) == "accelerator._schedulers[0].scheduler"
    # AND halving the LR survives the AcceleratedScheduler's later steps
    lam = sched.lr_lambdas[0]
    before = opt.param_groups[0]["lr"] / lam(sched.last_epoch)
    report = change_lr(d.optimizers, d.schedulers, scale=0.5, names=d.where)
    assert report["schedulers"][0]["holds"] == "holds"
    for _ in range(5):
        step()
    assert opt.param_groups[0]["lr"] / lam(sched.last_epoch) == pytest.approx(0.5 * before)


def test_unwrap_takes_off_compile_and_names_lose_wrapper_parts():
    net = torch.nn.Linear(2, 2)
    compiled = torch.compile(net)  # wraps lazily; nothing is compiled until called
    assert unwrap.model(compiled) == (net, "._orig_mod")
    assert unwrap.clean_module_name(
        "_fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.attn") == "layers.0.attn"
    assert unwrap.optimizer(torch.optim.SGD(net.parameters(), lr=0.1)).defaults["lr"] == 0.1
