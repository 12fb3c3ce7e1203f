"""Python-integer references the golden tests share."""


def exact_round(num: int, den: int, mode: str) -> int:
    """``num / den`` (``den > 0``) rounded by ``mode``, in Python integers."""
    q, r = divmod(num, den)
    if mode == "floor" or 2 * r < den:
        return q
    if 2 * r > den:
        return q + 1
    return q + 1 if mode == "half_up" else q + q % 2
