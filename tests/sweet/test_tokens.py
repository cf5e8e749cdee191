import torch

from sweet.tokens import action_logprob_sum_and_mean, make_batch, token_logprobs, truncate_context


def test_truncate_keeps_head_and_tail():
    ctx = list(range(10))
    assert truncate_context(ctx, 6, keep_head=2) == [0, 1, 6, 7, 8, 9]
    assert truncate_context(ctx, 20, keep_head=2) == ctx


def test_make_batch_never_cuts_the_action():
    b = make_batch([([1, 2, 3, 4, 5], [7, 8]), ([1], [9])], pad_id=0, max_length=5, keep_head=1)
    # first: context truncated to 3 tokens (head 1 + last 2), action kept whole
    assert b.input_ids[0].tolist() == [1, 4, 5, 7, 8]
    assert b.action_mask[0].tolist() == [0, 0, 0, 1, 1]
    assert b.input_ids[1].tolist() == [1, 9, 0, 0, 0]
    assert b.attention_mask[1].tolist() == [1, 1, 0, 0, 0]
    assert b.action_mask[1].tolist() == [0, 1, 0, 0, 0]


class _Bigram(torch.nn.Module):
    """Logits depend only on the current token: easy to compute by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.table[input_ids]})


def test_token_logprobs_by_hand():
    table = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    b = make_batch([([0], [1, 1])], pad_id=2)
    lp = token_logprobs(_Bigram(table), b)
    # P(1|0)=0.25, P(1|1)=0.8
    assert torch.allclose(lp[0], torch.tensor([0.0, torch.log(torch.tensor(0.25)), torch.log(torch.tensor(0.8))]))
    total, mean = action_logprob_sum_and_mean(lp, b.action_mask)
    assert torch.allclose(total, torch.log(torch.tensor([0.25 * 0.8])))
    assert torch.allclose(mean, total / 2)
