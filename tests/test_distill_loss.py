"""The on-policy distillation loss equals the reverse KL computed directly on a toy vocabulary.

``reverse_kl`` has two forms (see its docstring): exact over the teacher's top-k (with k the
whole vocabulary: the true reverse KL, value and gradient), and the sampled-token estimate,
whose gradient in expectation over the student's own samples is the gradient of the true
reverse KL. Both are checked here against ``sum_v p_s(v) (log p_s(v) - log p_t(v))`` written
out, and ``grpo_loss`` is checked to add the term with its weight and report its metrics.
"""

from __future__ import annotations

import torch

from art_core.training.loss import grpo_loss, reverse_kl

VOCAB = 7


def _toy(seed: int, positions: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(positions, VOCAB, generator=generator, dtype=torch.float64)
    teacher_logprobs = torch.log_softmax(
        torch.randn(positions, VOCAB, generator=generator, dtype=torch.float64) * 2, dim=-1
    )
    return student_logits, teacher_logprobs


def _direct_reverse_kl(
    student_logits: torch.Tensor, teacher_logprobs: torch.Tensor
) -> torch.Tensor:
    student = torch.log_softmax(student_logits, dim=-1)
    return (student.exp() * (student - teacher_logprobs)).sum(-1)


def test_top_k_over_the_whole_vocabulary_is_the_exact_reverse_kl() -> None:
    logits, teacher = _toy(seed=1)
    ours_logits = logits.clone().requires_grad_(True)
    direct_logits = logits.clone().requires_grad_(True)
    # The teacher's "top-k" in its own order (a permutation): order must not matter.
    order = torch.argsort(teacher, dim=-1, descending=True)
    sampled = torch.zeros(4, dtype=torch.long)
    loss, kl = reverse_kl(
        torch.log_softmax(ours_logits, -1)[torch.arange(4), sampled],
        teacher[torch.arange(4), sampled],
        student_top_logprobs=torch.log_softmax(ours_logits, -1).gather(-1, order),
        teacher_top_logprobs=teacher.gather(-1, order),
    )
    direct = _direct_reverse_kl(direct_logits, teacher)
    torch.testing.assert_close(loss, direct)
    torch.testing.assert_close(kl, direct.detach())
    assert (kl > 0).all()
    loss.sum().backward()
    direct.sum().backward()
    torch.testing.assert_close(ours_logits.grad, direct_logits.grad)


def test_top_k_counts_the_students_mass_outside_the_teachers_tokens() -> None:
    """k < vocab: the KL over the k tokens plus one bucket for every other token."""
    logits, teacher = _toy(seed=2)
    logits = logits.clone().requires_grad_(True)
    top = torch.topk(teacher, 3, dim=-1).indices
    student = torch.log_softmax(logits, -1)
    loss, kl = reverse_kl(
        torch.zeros(4),
        torch.zeros(4),
        student_top_logprobs=student.gather(-1, top),
        teacher_top_logprobs=teacher.gather(-1, top),
    )
    p_s, p_t = student.exp().gather(-1, top), teacher.exp().gather(-1, top)
    rest_s, rest_t = 1 - p_s.sum(-1), 1 - p_t.sum(-1)
    expected = (p_s * (p_s.log() - p_t.log())).sum(-1) + rest_s * (rest_s.log() - rest_t.log())
    torch.testing.assert_close(loss, expected)
    # A lower bound of the full reverse KL (data processing), and not a trivial one.
    full = _direct_reverse_kl(logits.detach(), teacher)
    assert (kl <= full + 1e-12).all() and (kl > 0.05 * full).all()
    # Renormalising over the k tokens alone would be blind to this student: the same shape
    # on the k tokens as the teacher, with most of its mass elsewhere. The bucket sees it.
    same_shape = teacher.gather(-1, top) - 3.0
    blind, _ = reverse_kl(
        torch.zeros(4),
        torch.zeros(4),
        student_top_logprobs=same_shape,
        teacher_top_logprobs=teacher.gather(-1, top),
    )
    assert (blind > 0.5).all()


def test_sampled_token_gradient_is_the_reverse_kl_gradient_in_expectation() -> None:
    """Summing the estimator's gradient over every token x, weighted by p_s(x), gives
    exactly the gradient of the true reverse KL (the expectation, computed in closed form)."""
    logits, teacher = _toy(seed=3)
    direct_logits = logits.clone().requires_grad_(True)
    _direct_reverse_kl(direct_logits, teacher).sum().backward()

    ours_logits = logits.clone().requires_grad_(True)
    student = torch.log_softmax(ours_logits, dim=-1)
    probabilities = student.exp().detach()
    expected_loss = torch.zeros((), dtype=torch.float64)
    rows = torch.arange(4)
    for x in range(VOCAB):
        sampled = torch.full((4,), x)
        loss, kl = reverse_kl(student[rows, sampled], teacher[rows, sampled])
        torch.testing.assert_close(kl, (student[rows, sampled] - teacher[rows, sampled]).detach())
        expected_loss = expected_loss + (probabilities[:, x] * loss).sum()
    expected_loss.backward()
    torch.testing.assert_close(ours_logits.grad, direct_logits.grad)
    # The estimate itself is unbiased too: E_x[kl(x)] is the reverse KL.
    estimate = (probabilities * (student - teacher).detach()).sum(-1)
    torch.testing.assert_close(estimate, _direct_reverse_kl(logits, teacher))


def test_grpo_loss_adds_the_distillation_term_with_its_weight() -> None:
    logprobs = torch.tensor([-0.5, -1.0, -2.0], requires_grad=True)
    teacher = torch.tensor([-0.25, -3.0, -2.0])
    weights = torch.tensor([0.25, 0.25, 0.5])
    distill = reverse_kl(logprobs, teacher)
    alone = grpo_loss(
        logprobs,
        logprobs.detach(),
        torch.tensor([1.0, 1.0, -1.0]),
        weights,
        policy_loss_weight=0.0,
        distill=distill,
        distill_weight=2.0,
        teacher_top_ids=torch.tensor([[5], [4], [9]]),
        target_ids=torch.tensor([5, 7, 9]),
    )
    kl = torch.tensor([-0.25, 2.0, 0.0])
    torch.testing.assert_close(alone.loss, (weights * 2.0 * kl * logprobs).sum())
    assert abs(alone.metrics["distill/kl"] - float((weights * kl).sum())) < 1e-6
    assert abs(alone.metrics["distill/teacher_agreement"] - 0.75) < 1e-6
    alone.loss.backward()
    torch.testing.assert_close(logprobs.grad, weights * 2.0 * kl)

    with_rl = grpo_loss(
        logprobs,
        logprobs.detach(),
        torch.tensor([1.0, 1.0, -1.0]),
        weights,
        distill=reverse_kl(logprobs, teacher),
    )
    policy = -(weights * torch.tensor([1.0, 1.0, -1.0])).sum()
    torch.testing.assert_close(with_rl.loss, policy + (weights * kl * logprobs).sum())
