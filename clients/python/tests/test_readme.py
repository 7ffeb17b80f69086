"""The README's examples run as written (against the suite's database, in
place of the README's db.internal): the scoped form sells one unit with the
lease's token, and the retry helper's example too."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
URL = '"postgresql://app@db.internal/shop"'


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def stock_of(admin, item):
    row = admin.execute("SELECT stock, fence_token FROM inventory WHERE item_id = %s", (item,)).fetchone()
    return row


def ensure_item(admin, item, stock):
    if stock_of(admin, item) is None:
        lock = f"inventory:{item}"
        t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
        admin.execute("INSERT INTO inventory VALUES (%s, %s, %s)", (item, stock, t))
        admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))


def test_the_readme_example_sells_one_unit_with_the_leases_token(dsn, admin):
    example = python_blocks()[0]
    assert URL in example and "def sell_one" in example
    scope = {}
    exec(compile(example.replace(URL, repr(dsn)), str(README), "exec"), scope)
    ensure_item(admin, 7, 5)
    before = stock_of(admin, 7)[0]
    assert scope["sell_one"](7) == before - 1
    stock, token = stock_of(admin, 7)
    assert stock == before - 1
    (ended_by,) = admin.execute("SELECT ended_by FROM fenced_lock_history WHERE name = 'inventory:7' "
                                "AND token = %s", (token,)).fetchone()
    assert ended_by == "release"


def test_the_readme_retry_helper_example_runs(dsn, admin):
    first, retry = python_blocks()[:2]
    scope = {}
    exec(compile(first.replace(URL, repr(dsn)), str(README), "exec"), scope)
    ensure_item(admin, 1, 10)
    before = stock_of(admin, 1)[0]
    exec(compile(retry, str(README), "exec"), scope)
    assert scope["left"] == before - 1 == stock_of(admin, 1)[0]
