package testpg

// AtCommit is SQL that, sent inside a transaction, runs body (PL/pgSQL
// statements) when that transaction commits, after the client sent COMMIT:
// a deferred constraint trigger on a temporary table. Tests use it to fail
// a commit from the server's side.
func AtCommit(body string) string {
	return `
CREATE TEMP TABLE at_commit (n int) ON COMMIT DROP;
CREATE OR REPLACE FUNCTION pg_temp.at_commit() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN ` + body + ` RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON at_commit DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION pg_temp.at_commit();
INSERT INTO at_commit VALUES (1)`
}

// EndConnectionAtCommit ends the connection during COMMIT (AtCommit): from
// the client's side, a commit whose answer never came. Here it did not land.
var EndConnectionAtCommit = AtCommit(`PERFORM pg_terminate_backend(pg_backend_pid());`)

// RefuseAtCommit fails COMMIT with an ERROR (AtCommit): the server rolled
// the transaction back and said so.
var RefuseAtCommit = AtCommit(`RAISE EXCEPTION 'refused at commit';`)
