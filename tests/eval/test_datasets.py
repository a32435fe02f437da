import pytest

from dartree.eval.datasets import DATASETS, load_prompts


@pytest.mark.parametrize("name", DATASETS)
def test_every_dataset_loads_real_text_deterministically(name):
    first = load_prompts(name, 3)
    assert len(first) == 3 and all(p.dataset == name and p.text.strip() for p in first)
    assert load_prompts(name, 3) == first
    assert len({p.id for p in first}) == 3


def test_offset_gives_disjoint_prompts_and_stdlib_is_the_held_out_split():
    from dartree.training.data import is_validation

    a, b = load_prompts("stdlib", 2), load_prompts("stdlib", 2, offset=2)
    assert not {p.id for p in a} & {p.id for p in b}
    assert all(is_validation(p.id) for p in a + b)
    assert load_prompts("humaneval", 1)[0].id == "HumanEval/0"
    assert all(len(p.text) <= 200 for p in load_prompts("packages", 3, prompt_chars=200))


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "wiki", "num_prompts": 1}, "dataset: must be one of"),
    ({"name": "humaneval", "num_prompts": 0}, "num_prompts"),
    ({"name": "humaneval", "num_prompts": 1, "offset": -1}, "offset"),
    ({"name": "humaneval", "num_prompts": 200}, "num_prompts: dataset 'humaneval' has 164"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_prompts(**kwargs)


@pytest.mark.parametrize("name", ["humaneval", "packages"])
def test_count_prompts_is_how_many_load_prompts_gives(name):
    from dartree.eval.datasets import count_prompts

    n = count_prompts(name)
    assert len(load_prompts(name, n)) == n
    with pytest.raises(ValueError, match=f"has {n} prompts"):
        load_prompts(name, n + 1)
    with pytest.raises(ValueError, match="name: the dataset must be one of"):
        count_prompts("wiki")
