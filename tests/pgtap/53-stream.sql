-- The stream: appends are refused with coded errors when malformed; an entry appended in a
-- transaction still open is not read (commit-safe reads stop below the oldest running
-- transaction, this one included); positions are refused unless stream_read's; cursors are
-- saved and loaded in the caller's transaction, per consumer and key. Reads of committed
-- entries, in any commit order, are in tests/python/test_stream.py (they need transactions
-- other than this one).

BEGIN;
SELECT plan(14);

SELECT matches(
    x_jobs.stream_append(stream => 'orders', key => 'o-1', payload => '{"n": 1}'),
    '^[0-9]+/[0-9]+$',
    'stream_append should answer the entry''s position'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.stream_append_many(
        stream => 'orders', entries => '[{"key": "o-2", "payload": {"n": 2}}, {"payload": {"n": 3}}]'
    )),
    2,
    'stream_append_many should answer a position an entry'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.stream_read(stream => 'orders')$$,
    'Entries of a transaction still open, this one, should not be read'
);
SELECT throws_ok(
    $$SELECT x_jobs.stream_append('', NULL, '{}')$$,
    'XJ067', 'X_STREAM_INVALID: stream '''' is not a stream name',
    'An empty stream name should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.stream_append('orders', NULL, NULL)$$,
    'XJ067', 'X_STREAM_INVALID: the entry for stream ''orders'' has no payload',
    'An entry without a payload should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.stream_append('orders', repeat('k', 401), '{}')$$,
    'XJ067', NULL,
    'A key longer than 400 characters should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.stream_append_many('orders', '[{"key": "a"}]')$$,
    'XJ067', 'X_STREAM_INVALID: entry 1 for stream ''orders'' is not an object of a payload and a key',
    'An entry of stream_append_many without a payload should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.stream_append_many('orders', '{"payload": 1}')$$,
    'XJ067', NULL,
    'stream_append_many should refuse entries that are not an array'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.stream_read('orders', after => '12')$$,
    'XJ068', 'X_POSITION_INVALID: position ''12'' is not a stream position',
    'A position stream_read did not answer should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.stream_read('orders', max_rows => 0)$$,
    'XJ013', 'X_QTY_INVALID: max_rows 0 is outside 1..10000',
    'A max_rows below 1 should be refused'
);

-- Cursors.
SELECT is(
    x_jobs.consumer_cursor(consumer => 'mailer', key => 'o-1'), NULL,
    'A consumer with no cursor saved should get NULL'
);
SELECT x_jobs.save_cursor(consumer => 'mailer', key => 'o-1', cursor => '"10/5"');
SELECT x_jobs.save_cursor(consumer => 'mailer', key => 'o-1', cursor => '"11/7"');
SELECT is(
    x_jobs.consumer_cursor(consumer => 'mailer', key => 'o-1'), '"11/7"'::jsonb,
    'The last cursor saved should be the consumer''s'
);
SELECT is(x_jobs.consumer_cursor(consumer => 'other', key => 'o-1'), NULL, 'Cursors should be per consumer');
SELECT throws_ok(
    $$SELECT x_jobs.save_cursor('', 'k', '1')$$,
    'XJ069', NULL,
    'A cursor of a consumer without a name should be refused'
);

SELECT * FROM finish();
ROLLBACK;
