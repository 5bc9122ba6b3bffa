"""Promise (costtable.py): "bad entries refused with a clear error" — a table someone else wrote is
either what it says or refused.

Steps: parse_costs of {"format": ..., "version": 1, "costs": {"tg-1": 5.0, "tg-1": 0.01}} (a merge
gone wrong, or a file edited to hide a value behind a later one); the same with "version" twice.

Expected: CostTableError naming the duplicated key.
Actual: json.loads keeps the last value: tg-1 silently costs 0.01, and a second "version" silently
decides the version.
"""
from tracer.dispatch.costtable import CostTableError, parse_costs

for text in ('{"format":"rmqtrace.costs","version":1,"costs":{"tg-1":5.0,"tg-1":0.01}}',
             '{"format":"rmqtrace.costs","version":2,"version":1,"costs":{}}'):
    try:
        parse_costs(text)
    except CostTableError as exc:
        print("refused:", exc)
        assert "duplicate" in str(exc), exc
        continue
    raise SystemExit(f"a duplicated key was taken silently: {text}")
