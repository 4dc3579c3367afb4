package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/walcount/walcount/counter"
)

// Overrides are the settings given as command-line flags: the flag's name
// (without dashes, a Setting.Flag) to its value as text, as the flag
// holds it. A flag that is absent was not given and leaves the value from
// the environment, the file or the default in place.
type Overrides map[string]string

// Load builds the Config that walcount runs with. Each setting comes from
// the first of these that sets it:
//
//	flag (ov)  >  environment  >  file  >  default
//
// The environment variable of a setting is its Setting.Env (WALCOUNT_SLOT
// for --slot). DATABASE_URL and REDIS_URL, which platforms set for every
// process, are fallbacks below the file: the database URL is
// ov.DatabaseURL, else WALCOUNT_DATABASE_URL, else the file's
// database_url, else DATABASE_URL, else DefaultDatabaseURL. The file is
// path (the --config flag), else WALCOUNT_CONFIG; with neither there is no
// file. An environment variable set to the empty string counts as unset.
// env looks variables up (nil means os.LookupEnv); it is also the source
// of ${VAR} expansion in the file.
//
// The result is validated. Any problem is reported as a *Error, which names
// where the bad value came from: the file, the flag or the variable.
func Load(path string, env func(string) (string, bool), ov Overrides) (Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	l := &loader{cfg: Default(), env: env, origin: map[string]string{},
		flagged: map[string]bool{}, envProblems: map[string]Problem{}}
	// The conventional variables come first, so that the file and
	// walcount's own variables override them.
	l.applyFallbacks()
	if path == "" {
		path, _, _ = firstEnv(env, EnvConfig)
	}
	if path != "" {
		if err := l.readFile(path); err != nil {
			return Config{}, err
		}
	}
	l.applyEnv()
	if problems := l.applyFlags(ov); len(problems) > 0 {
		return Config{}, &Error{Problems: problems}
	}
	problems, err := l.validate()
	if err != nil {
		return Config{}, err
	}
	if len(problems) > 0 {
		return Config{}, &Error{Problems: problems}
	}
	cfg := l.cfg
	cfg.Origin = map[string]string{}
	for field := range l.fileSet {
		cfg.Origin[field] = l.path
	}
	maps.Copy(cfg.Origin, l.origin)
	return cfg, nil
}

// loader is one Load under way.
type loader struct {
	cfg Config
	env func(string) (string, bool)
	// path is the file read, "" for none; fileSet its top-level keys.
	path    string
	fileSet map[string]bool
	// origin maps a field (its YAML key) to the flag or variable that
	// set it, so that a problem can be blamed on the right place.
	origin map[string]string
	// flagged are the fields a flag set.
	flagged map[string]bool
	// envProblems are values of variables that do not parse, by field.
	// A flag that sets the field makes them moot.
	envProblems map[string]Problem
}

// applyFallbacks sets what the conventional variables (DATABASE_URL)
// hold.
func (l *loader) applyFallbacks() {
	for _, s := range Settings {
		if s.Fallback == "" {
			continue
		}
		if v, name, ok := firstEnv(l.env, s.Fallback); ok {
			_ = s.Set(&l.cfg, v) // fallbacks are URLs, which parse as text
			l.origin[s.Key] = name
		}
	}
}

// readFile decodes the file at path over the configuration; what it sets
// overrides the fallbacks.
func (l *loader) readFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return &Error{Problems: []Problem{{Source: path, Msg: "read config file: " + err.Error()}}}
	}
	set, err := decode(data, path, l.env, &l.cfg)
	if err != nil {
		return err
	}
	l.path, l.fileSet = path, set
	for field := range set {
		delete(l.origin, field) // the file overrides the fallbacks
	}
	l.cfg.File = path
	return nil
}

// applyEnv sets what walcount's own variables hold; a value that does not
// parse is kept in envProblems.
func (l *loader) applyEnv() {
	for _, s := range Settings {
		if s.Env == "" || s.Key == "" {
			continue
		}
		v, name, ok := firstEnv(l.env, s.Env)
		if !ok {
			continue
		}
		if err := s.Set(&l.cfg, v); err != nil {
			l.envProblems[s.Key] = Problem{Source: name, Msg: err.Error()}
			continue
		}
		l.origin[s.Key] = name
	}
}

// applyFlags sets what the flags hold and returns the flags whose values
// do not parse.
func (l *loader) applyFlags(ov Overrides) []Problem {
	var problems []Problem
	for _, s := range Settings {
		v, ok := ov[s.Flag]
		if !ok || s.Key == "" {
			continue
		}
		if err := s.Set(&l.cfg, v); err != nil {
			problems = append(problems, Problem{Source: "--" + s.Flag, Msg: err.Error()})
			continue
		}
		l.origin[s.Key], l.flagged[s.Key] = "--"+s.Flag, true
	}
	return problems
}

// validate validates the result and returns its problems, each blamed on
// the flag, the variable or the file that set the value, and the
// variables that did not parse (unless a flag set their field).
func (l *loader) validate() ([]Problem, error) {
	var problems []Problem
	if err := l.cfg.Validate(); err != nil {
		var ce *Error
		if !errors.As(err, &ce) {
			return nil, err
		}
		for _, p := range ce.Problems {
			if _, bad := l.envProblems[SettingKey(p.Field)]; bad {
				continue // the variable's own problem says more
			}
			if o, ok := l.origin[SettingKey(p.Field)]; ok {
				// A flag or a variable holds exactly one value: its
				// name says everything the field path would.
				p.Source, p.Field = o, ""
			} else if l.path != "" {
				p.Source = l.path
			}
			problems = append(problems, p)
		}
	}
	for _, s := range Settings {
		if p, bad := l.envProblems[s.Key]; bad && !l.flagged[s.Key] {
			problems = append(problems, p)
		}
	}
	return problems, nil
}

// Parse reads a YAML configuration file over Default and validates the
// result. source names the file in errors. ${VAR} and ${VAR:-default} are
// expanded from the process environment first (see Expand). Unknown fields
// are rejected so that a misspelt setting cannot silently keep its default.
func Parse(data []byte, source string) (Config, error) {
	cfg := Default()
	if _, err := decode(data, source, os.LookupEnv, &cfg); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			for i := range ce.Problems {
				ce.Problems[i].Source = source
			}
		}
		return Config{}, err
	}
	return cfg, nil
}

// fileConfig is the YAML layout of a configuration file: Config, whose
// yaml tags are the keys of Table, and the counters, whose names are SQL
// identifiers that are normalised on the way in (fileCounters).
type fileConfig struct {
	Config   `yaml:",inline"`
	Counters []fileCounter `yaml:"counters"`
}

type fileCounter struct {
	Name          string               `yaml:"name"`
	Source        string               `yaml:"source"`
	Key           string               `yaml:"key"`
	Target        string               `yaml:"target"`
	TargetKey     string               `yaml:"target_key"`
	Column        string               `yaml:"column"`
	Sum           string               `yaml:"sum"`
	Max           string               `yaml:"max"`
	Min           string               `yaml:"min"`
	Where         map[string]yaml.Node `yaml:"where"`
	TargetRow     yaml.Node            `yaml:"target_row"`
	AppendOnly    bool                 `yaml:"append_only"`
	CreateMissing yaml.Node            `yaml:"create_missing"`
	Via           *fileVia             `yaml:"via"`
}

// fileVia is a counter's via: the parent row its key reaches the target
// through (counter.Through).
type fileVia struct {
	Table  string               `yaml:"table"`
	Key    string               `yaml:"key"`
	Column string               `yaml:"column"`
	Where  map[string]yaml.Node `yaml:"where"`
}

// decode expands data, decodes it over *cfg and returns the set of
// top-level keys the file sets. It does not validate.
func decode(data []byte, source string, env func(string) (string, bool), cfg *Config) (map[string]bool, error) {
	expanded, err := Expand(data, env)
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			for i := range ce.Problems {
				ce.Problems[i].Source = source
			}
		}
		return nil, err
	}

	// The top-level keys are needed for precedence (a key the file sets
	// overrides the environment even when its value equals the default).
	var doc yaml.Node
	if err := yaml.Unmarshal(expanded, &doc); err != nil {
		return nil, indentationLine(yamlError(source, err), expanded)
	}
	set := map[string]bool{}
	if len(doc.Content) == 1 && doc.Content[0].Kind == yaml.MappingNode {
		m := doc.Content[0]
		for i := 0; i+1 < len(m.Content); i += 2 {
			set[m.Content[i].Value] = true
			// The keys of a block of settings (slot_monitor.poll_interval),
			// for Config.Origin; a counter's are not settings.
			if v := m.Content[i+1]; v.Kind == yaml.MappingNode && m.Content[i].Value != "counters" {
				for j := 0; j+1 < len(v.Content); j += 2 {
					set[m.Content[i].Value+"."+v.Content[j].Value] = true
				}
			}
		}
	} else if len(doc.Content) == 1 && !(doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
		return nil, &Error{Problems: []Problem{{Source: source, Line: doc.Content[0].Line, Msg: "the file must be a mapping of settings"}}}
	}

	fc := fileConfig{Config: *cfg}
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(source, err)
	}
	*cfg = fc.Config

	// An absent or empty counters list keeps the default counter, as
	// Config.Counters documents.
	if len(fc.Counters) > 0 {
		counters, problems := fileCounters(fc.Counters)
		if len(problems) > 0 {
			for i := range problems {
				problems[i].Source = source
			}
			return nil, &Error{Problems: problems}
		}
		cfg.Counters = counters
	}
	return set, nil
}

// fileCounters turns the counters of a file into Counters: column names are
// read as SQL identifiers (lowercased unless double-quoted) and where values
// must be scalars or null.
func fileCounters(in []fileCounter) ([]counter.Counter, []Problem) {
	var problems []Problem
	out := make([]counter.Counter, len(in))
	for i, fc := range in {
		field := counter.FieldPath(i, fc.Name)
		col := func(name, v string) string {
			if v == "" {
				return ""
			}
			id, err := counter.ParseIdent(v)
			if err != nil {
				problems = append(problems, Problem{Field: field + "." + name, Msg: err.Error()})
				return v
			}
			return id
		}
		c := counter.Counter{
			Name:       fc.Name,
			Source:     fc.Source,
			Key:        col("key", fc.Key),
			Target:     fc.Target,
			TargetKey:  col("target_key", fc.TargetKey),
			Column:     col("column", fc.Column),
			Sum:        col("sum", fc.Sum),
			Max:        col("max", fc.Max),
			Min:        col("min", fc.Min),
			AppendOnly: fc.AppendOnly,
		}
		if n := fc.TargetRow; n.Kind != 0 && n.Tag != "!!null" && !(n.Kind == yaml.ScalarNode && n.Value == "") {
			if n.Kind != yaml.ScalarNode {
				problems = append(problems, Problem{Line: n.Line, Field: field + ".target_row", Msg: "must be the target_key value of the one row the total is kept in (a number or a string)"})
			} else {
				c.TargetRow = n.Value
			}
		}
		if msgs := createMissing(&c, fc.CreateMissing, col); len(msgs) > 0 {
			for _, m := range msgs {
				m.Field = field + ".create_missing" + m.Field
				problems = append(problems, m)
			}
		}
		var ps []Problem
		c.Where, c.Filters, ps = fileWhere(field, "where", fc.Where, col)
		problems = append(problems, ps...)
		if v := fc.Via; v != nil && (v.Table != "" || v.Key != "" || v.Column != "" || len(v.Where) > 0) {
			th := &counter.Through{Table: v.Table, Key: col("via.key", v.Key), Column: col("via.column", v.Column)}
			th.Where, th.Filters, ps = fileWhere(field, "via.where", v.Where, col)
			problems = append(problems, ps...)
			c.Through = th
			for _, p := range counter.ThroughProblems(field, c) {
				problems = append(problems, Problem{Field: p.Field, Msg: p.Msg})
			}
		}
		out[i] = c
	}
	if len(problems) > 0 {
		return out, problems
	}
	// A counter through a parent is kept as the level above a via table
	// and the via table's own counters (counter.ExpandThrough).
	return counter.ExpandThrough(out), nil
}

// fileWhere reads a where mapping: a scalar is equality, null IS NULL,
// and a list or a mapping one of the other filters (whereFilter). field
// and sub name the mapping in problems.
func fileWhere(field, sub string, in map[string]yaml.Node, col func(name, v string) string) (map[string]*string, map[string]counter.Filter, []Problem) {
	var problems []Problem
	var where map[string]*string
	var filters map[string]counter.Filter
	if in != nil {
		where = make(map[string]*string, len(in))
	}
	for _, k := range slices.Sorted(maps.Keys(in)) {
		n := in[k]
		wf := field + "." + sub + "." + k
		name := col(sub+"."+k, k)
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = *n.Alias
		}
		_, dupW := where[name]
		_, dupF := filters[name]
		if dupW || dupF {
			problems = append(problems, Problem{Field: wf, Msg: fmt.Sprintf("column %q is listed twice", name)})
			continue
		}
		switch {
		case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
			where[name] = nil
		case n.Kind == yaml.ScalarNode:
			v := n.Value
			where[name] = &v
		default:
			f, msg := whereFilter(&n)
			if msg != "" {
				problems = append(problems, Problem{Line: n.Line, Field: wf, Msg: msg})
				continue
			}
			if filters == nil {
				filters = map[string]counter.Filter{}
			}
			filters[name] = f
		}
	}
	return where, filters, problems
}

// createMissingHelp is the forms create_missing may take.
const createMissingHelp = "must be true, false or {defaults: {column: value, ...}} (the values the other columns of a created target row get)"

// createMissing reads a counter's create_missing: true, false, or a
// mapping whose only key is defaults, a mapping of target columns to
// scalar values. Problems name their field below create_missing.
func createMissing(c *counter.Counter, n yaml.Node, col func(name, v string) string) []Problem {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = *n.Alias
	}
	switch {
	case n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null"):
		return nil
	case n.Kind == yaml.ScalarNode && n.Tag == "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return []Problem{{Line: n.Line, Msg: createMissingHelp}}
		}
		c.CreateMissing = b
		return nil
	case n.Kind != yaml.MappingNode:
		return []Problem{{Line: n.Line, Msg: createMissingHelp}}
	}
	c.CreateMissing = true
	var ps []Problem
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value != "defaults" {
			ps = append(ps, Problem{Line: k.Line, Field: "." + k.Value, Msg: "unknown key: " + createMissingHelp})
			continue
		}
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue
		}
		if v.Kind != yaml.MappingNode {
			ps = append(ps, Problem{Line: v.Line, Field: ".defaults", Msg: "must be a mapping of target columns to the values a created row gets"})
			continue
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			dk, dv := v.Content[j], v.Content[j+1]
			if dv.Kind == yaml.AliasNode && dv.Alias != nil {
				dv = dv.Alias
			}
			name := col("create_missing.defaults."+dk.Value, dk.Value)
			switch {
			case dv.Kind == yaml.ScalarNode && dv.Tag == "!!null":
				ps = append(ps, Problem{Line: dv.Line, Field: ".defaults." + dk.Value, Msg: "null is what a column without a default gets anyway: leave it out"})
			case dv.Kind != yaml.ScalarNode:
				ps = append(ps, Problem{Line: dv.Line, Field: ".defaults." + dk.Value, Msg: "must be a value (a number, a string, true or false)"})
			default:
				if _, dup := c.Defaults[name]; dup {
					ps = append(ps, Problem{Line: dk.Line, Field: ".defaults." + dk.Value, Msg: fmt.Sprintf("column %q is listed twice", name)})
					continue
				}
				if c.Defaults == nil {
					c.Defaults = map[string]string{}
				}
				c.Defaults[name] = dv.Value
			}
		}
	}
	return ps
}

// whereHelp is the forms a where value may take.
const whereHelp = "must be a value (equality), null (IS NULL), a list of values (IN), or {not: null} (IS NOT NULL), {not: value} (<>) or {not: [values]} (NOT IN)"

// whereFilter reads a where value that is a list or a mapping: a list of
// scalars is IN, {not: null} IS NOT NULL, {not: scalar} <> and
// {not: [scalars]} NOT IN. It returns a message for anything else.
func whereFilter(n *yaml.Node) (counter.Filter, string) {
	list := func(n *yaml.Node) ([]string, string) {
		var vs []string
		for _, e := range n.Content {
			if e.Kind == yaml.AliasNode && e.Alias != nil {
				e = e.Alias
			}
			switch {
			case e.Kind != yaml.ScalarNode:
				return nil, "a list holds values only: " + whereHelp
			case e.Tag == "!!null":
				return nil, "a list cannot hold null (in SQL, x IN (…, NULL) never matches a NULL): filter NULL with a separate counter, or leave it out"
			}
			vs = append(vs, e.Value)
		}
		if len(vs) == 0 {
			return nil, "the list is empty, and would match no row"
		}
		return vs, ""
	}
	switch n.Kind {
	case yaml.SequenceNode:
		vs, msg := list(n)
		return counter.Filter{Op: counter.OpIn, Values: vs}, msg
	case yaml.MappingNode:
		if len(n.Content) != 2 || n.Content[0].Value != "not" {
			return counter.Filter{}, whereHelp
		}
		v := n.Content[1]
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			return counter.Filter{Op: counter.OpNotNull}, ""
		case v.Kind == yaml.ScalarNode:
			return counter.Filter{Op: counter.OpNe, Values: []string{v.Value}}, ""
		case v.Kind == yaml.SequenceNode:
			vs, msg := list(v)
			return counter.Filter{Op: counter.OpNotIn, Values: vs}, msg
		}
	}
	return counter.Filter{}, whereHelp
}

// yamlLine matches the "line N: message" form of go-yaml's errors.
var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlTypeNames replaces go-yaml's mentions of the decoding types with
// words a user of the file understands.
var yamlTypeNames = strings.NewReplacer(
	"in type config.fileCounter", "in a counter",
	"in type config.fileVia", "in a counter's via",
	"in type config.fileConfig", "at the top level",
	"in type config.ReconcileSettings", "in reconcile",
	"in type config.SlotSettings", "in slot_monitor",
	"in type config.RedisTLS", "in redis_tls",
	"in type config.RedisSentinel", "in redis_sentinel",
	"into time.Duration", "into a duration (write it like 1s, 500ms or 1h)",
	"into []config.fileCounter", "into the counters list",
	"into config.fileCounter", "into a counter",
	"into config.fileConfig", "into the settings",
	"into config.ReconcileSettings", "into reconcile settings",
	"into config.SlotSettings", "into slot_monitor settings",
	"into config.RedisTLS", "into redis_tls settings",
	"into config.RedisSentinel", "into redis_sentinel settings",
	"into map[string]yaml.Node", "into a where mapping",
)

// yamlError turns a go-yaml error into a *Error that keeps its line numbers.
func yamlError(source string, err error) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	ce := &Error{}
	for _, m := range msgs {
		p := Problem{Source: source, Msg: strings.TrimPrefix(m, "yaml: ")}
		if sm := yamlLine.FindStringSubmatch(m); sm != nil {
			p.Line, _ = strconv.Atoi(sm[1])
			p.Msg = sm[2]
		}
		if f, ok := strings.CutPrefix(p.Msg, "field "); ok {
			if name, _, ok := strings.Cut(f, " not found "); ok {
				p.Msg = fmt.Sprintf("unknown field %q %s", name, yamlTypeNames.Replace(strings.TrimPrefix(f, name+" not found ")))
			}
		}
		p.Msg = yamlTypeNames.Replace(p.Msg)
		ce.Problems = append(ce.Problems, p)
	}
	return ce
}

// indentationMessages are go-yaml's complaints about a line indented
// wrong, which it reports at the line where the enclosing block starts.
var indentationMessages = []string{"did not find expected key", "did not find expected '-' indicator",
	"found a tab character that violates indentation", "did not find expected node content"}

// indentationLine moves a problem about indentation that err reports at
// the start of the enclosing block to the line that is indented wrong:
// the first one, from there on, whose indentation is none of the open
// blocks', or that indents with a tab.
func indentationLine(err error, data []byte) error {
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Line == 0 {
		return err
	}
	p := &ce.Problems[0]
	if !slices.ContainsFunc(indentationMessages, func(m string) bool { return strings.Contains(p.Msg, m) }) {
		return err
	}
	if line := misindented(data); line >= p.Line {
		p.Line = line
		p.Msg += ": the indentation of this line matches no enclosing block; indent it like the lines of its block, with spaces"
	}
	return err
}

// misindented returns the 1-based number of the first line of a YAML
// block document whose indentation does not match an open block, or 0.
func misindented(data []byte) int {
	type block struct {
		indent int
		seq    bool // a sequence's dashes are at indent
	}
	var open []block // increasing indentation
	scalar := -1     // indentation of the line opening a block scalar
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		if strings.TrimSpace(trimmed) == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if scalar >= 0 && indent > scalar {
			continue // inside a | or > scalar
		}
		scalar = -1
		if strings.HasPrefix(trimmed, "\t") {
			return i + 1
		}
		dash := strings.HasPrefix(trimmed, "- ") || trimmed == "-"
		popped := false
		for len(open) > 0 && open[len(open)-1].indent > indent {
			open, popped = open[:len(open)-1], true
		}
		top := len(open) - 1
		switch {
		case popped && (top < 0 || open[top].indent != indent):
			return i + 1 // back out of a block, to no block's column
		case top >= 0 && open[top].indent == indent && open[top].seq && !dash:
			return i + 1 // a key where the sequence's dashes are
		case top < 0 || open[top].indent < indent:
			open = append(open, block{indent: indent, seq: dash})
		}
		// "- key: v" opens a block at the key's column too.
		for rest := trimmed; strings.HasPrefix(rest, "- "); {
			after := strings.TrimLeft(rest[1:], " ")
			indent += len(rest) - len(after)
			open = append(open, block{indent: indent, seq: strings.HasPrefix(after, "- ")})
			rest = after
		}
		v := strings.TrimSpace(trimmed)
		if j := strings.Index(v, " #"); j >= 0 {
			v = strings.TrimSpace(v[:j])
		}
		if strings.HasSuffix(v, "|") || strings.HasSuffix(v, ">") || strings.HasSuffix(v, "|-") || strings.HasSuffix(v, ">-") {
			scalar = indent
		}
	}
	return 0
}

// Expand replaces ${VAR} with the value of VAR and ${VAR:-default} with the
// value of VAR, or default when VAR is unset or empty. A reference to an
// unset variable without a default is an error that names it, so that a
// forgotten secret fails loudly instead of connecting with an empty
// password. "$${" stands for a literal "${"; any other "$" is left as it is,
// so passwords containing "$" need no escaping.
//
// Problems are returned as a *Error with line numbers and no Source.
// Expansion is textual and happens before YAML parsing: a value that
// contains YAML syntax should be quoted in the file ("${VAR}").
func Expand(data []byte, env func(string) (string, bool)) ([]byte, error) {
	if env == nil {
		env = os.LookupEnv
	}
	var out bytes.Buffer
	var problems []Problem
	line := 1
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '\n':
			line++
		case c == '$' && bytes.HasPrefix(data[i:], []byte("$${")):
			out.WriteString("${")
			i += 3
			continue
		case c == '$' && i+1 < len(data) && data[i+1] == '{':
			end := bytes.IndexByte(data[i:], '}')
			if end < 0 || bytes.IndexByte(data[i:i+end], '\n') >= 0 {
				problems = append(problems, Problem{Line: line, Msg: "unterminated ${ (write $${ for a literal ${)"})
				out.Write(data[i:])
				i = len(data)
				continue
			}
			ref := string(data[i+2 : i+end])
			name, def, hasDef := strings.Cut(ref, ":-")
			v, ok := env(name)
			switch {
			case !envName.MatchString(name):
				problems = append(problems, Problem{Line: line, Msg: fmt.Sprintf("${%s}: %q is not a variable name", ref, name)})
			case hasDef && (!ok || v == ""):
				v = def
			case !ok:
				problems = append(problems, Problem{Line: line, Msg: fmt.Sprintf("${%s}: environment variable %s is not set", ref, name)})
			}
			out.WriteString(v)
			i += end + 1
			continue
		}
		out.WriteByte(c)
		i++
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	return out.Bytes(), nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// firstEnv returns the first of the named variables that is set and not
// empty, with its name.
func firstEnv(env func(string) (string, bool), names ...string) (value, name string, ok bool) {
	for _, n := range names {
		if v, ok := env(n); ok && v != "" {
			return v, n, true
		}
	}
	return "", "", false
}

// topField returns the top-level YAML key of a problem's field path.
func topField(field string) string {
	if i := strings.IndexAny(field, ".[ "); i >= 0 {
		return field[:i]
	}
	return field
}
