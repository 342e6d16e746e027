"""``db.compact_sql``: a statement without its comments and runs of blanks, its literals intact.

The slot's claim and completion statements are compacted where they are defined (psycopg
re-splits a statement longer than 4,096 characters on every execution); a compactor that
touched a literal or kept half a comment would change what they do.
"""

from __future__ import annotations

from durable_jobs.db import compact_sql


def test_comments_and_blank_runs_go():
    sql = """
    SELECT a,   -- the first column
           b    /* the second,
                   over two lines */
      FROM t
     WHERE x = 1
    """
    assert compact_sql(sql) == "SELECT a, b FROM t WHERE x = 1"


def test_literals_and_quoted_identifiers_are_left_as_they_are():
    sql = """SELECT '--  not a comment', 'it''s   /* kept */', "odd  ""name"" --"   FROM t"""
    assert compact_sql(sql) == (
        """SELECT '--  not a comment', 'it''s   /* kept */', "odd  ""name"" --" FROM t"""
    )


def test_a_comment_at_the_end_of_a_line_does_not_swallow_the_next_line():
    """The danger of joining lines: a line comment would run on over what followed it."""
    sql = "SELECT 1 -- one\n     + 2 AS three"
    assert compact_sql(sql) == "SELECT 1 + 2 AS three"


def test_operators_that_start_like_comments_are_kept():
    sql = "SELECT 4 - -1, 8 / 2, '{}'::jsonb #- '{a}', %(owner)s || '/' || id::text, 100 %% 7"
    assert compact_sql(sql) == sql


def test_the_claim_is_short_enough_for_psycopg_to_remember_how_it_splits():
    from durable_jobs import store

    assert len(store.DEQUEUE_OPEN) <= 4096
    assert "--" not in store.DEQUEUE_OPEN.replace("'--", "")
