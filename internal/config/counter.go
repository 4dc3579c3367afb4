package config

// Counter declares one counter cache: the rows of Source, grouped by Key,
// are counted (or their Sum column summed) into Target.Column of the row
// whose TargetKey equals the key. See DESIGN §3.
type Counter struct {
	// Name is unique among the counters; it is used in metrics, logs and
	// in walcount's Redis fields. It matches [a-z][a-z0-9_]*.
	Name string `yaml:"name"`
	// Source is the table whose rows are counted, schema-qualified
	// ("public.likes"). An unqualified name means schema public.
	Source string `yaml:"source"`
	// Key is the source column naming the target row.
	Key string `yaml:"key"`
	// Target is the table holding the counter column.
	Target string `yaml:"target"`
	// TargetKey is the target column matched against Key.
	TargetKey string `yaml:"target_key"`
	// Column is the target column that holds the count.
	Column string `yaml:"column"`
	// Sum, when set, names a numeric source column whose values are summed
	// instead of counting rows.
	Sum string `yaml:"sum"`
	// Where restricts the counted rows: every listed source column must
	// equal the given value. A nil value means IS NULL.
	Where map[string]*string `yaml:"where"`
}

// DefaultCounter is the counter that applies when no config file names any:
// the number of likes rows of each post, in posts.likes_count.
func DefaultCounter() Counter {
	return Counter{
		Name:      "post_likes",
		Source:    "public.likes",
		Key:       "post_id",
		Target:    "public.posts",
		TargetKey: "id",
		Column:    "likes_count",
	}
}
