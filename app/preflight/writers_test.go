package preflight_test

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/app/preflight"
)

// TestOtherWriters: the app's own counter cache left in place (a trigger
// on the source that updates the target, a rule that does the same, a
// BEFORE trigger of the target that sets the column) is a problem naming
// each, with the statements that drop them; a trigger that writes other
// columns of the target, a disabled one, and one that only reads the
// column are not.
func TestOtherWriters(t *testing.T) {
	t.Parallel()
	schema := goodSchema + `
ALTER TABLE posts ADD COLUMN title text, ADD COLUMN touched int NOT NULL DEFAULT 0;
CREATE FUNCTION likes_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    UPDATE public.posts p SET likes_count = p.likes_count + 1 WHERE p.id = NEW.post_id;
  ELSE
    UPDATE posts SET touched = touched + 1, likes_count = likes_count - 1 WHERE id = OLD.post_id;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER likes_count AFTER INSERT OR DELETE ON likes FOR EACH ROW EXECUTE FUNCTION likes_count();
CREATE FUNCTION likes_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE posts SET touched = touched + 1 WHERE id = NEW.post_id AND likes_count > 0; RETURN NULL; END $$;
CREATE TRIGGER likes_touch AFTER INSERT ON likes FOR EACH ROW EXECUTE FUNCTION likes_touch();
CREATE TRIGGER likes_count_off AFTER UPDATE ON likes FOR EACH ROW EXECUTE FUNCTION likes_count();
ALTER TABLE likes DISABLE TRIGGER likes_count_off;
CREATE FUNCTION posts_reset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.title IS DISTINCT FROM OLD.title THEN NEW.likes_count := 0; END IF; RETURN NEW; END $$;
CREATE TRIGGER posts_reset BEFORE UPDATE ON posts FOR EACH ROW EXECUTE FUNCTION posts_reset();
CREATE RULE likes_rule AS ON UPDATE TO likes DO ALSO UPDATE posts SET likes_count = likes_count WHERE id = NEW.post_id;
`
	f := newFixture(t, schema)
	fd := want(t, run(t, f.cfg), preflight.CheckOtherWriters, preflight.Problem,
		"trigger likes_count on likes, trigger posts_reset on posts, rule likes_rule on likes write public.posts.likes_count, which walcount keeps")
	wantFix(t, fd, "DROP TRIGGER likes_count ON likes; DROP TRIGGER posts_reset ON posts; DROP RULE likes_rule ON likes;")
	for _, not := range []string{"likes_touch", "likes_count_off"} {
		if strings.Contains(fd.Message, not) {
			t.Errorf("%s named: %s", not, fd.Message)
		}
	}

	// Once they are dropped (the fix as given), nothing else writes it.
	if _, err := f.conn.Exec(t.Context(), fd.Fix); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, f.cfg), preflight.CheckOtherWriters, preflight.OK, "no trigger or rule writes public.posts.likes_count")
}
