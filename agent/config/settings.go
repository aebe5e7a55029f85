package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// setting is one field of Config as its tags declare it (see Config): everything the file, the
// environment, the flags, the help and the error messages need to know about it, read from one
// place so that a setting cannot be added to one of them and forgotten in another.
type setting struct {
	key         string // YAML key; "group.key" for a key inside a mapping such as mqttPolicy
	flag        string // flag name, without "--"
	env         string // environment variable
	placeholder string // the flag's value in the help (KEY=VALUE, DURATION, ...)
	help        string // the flag's help, without the default (flagHelp adds it)
	defaultText string // the help's default, where showing the value itself would mislead
	split       bool   // a list flag's values are comma-separated lists too
	flagField   string // the field's name in Flags
	index       []int  // the field in Config
}

// field returns a pointer to the setting's field of c.
func (s setting) field(c *Config) any {
	return reflect.ValueOf(c).Elem().FieldByIndex(s.index).Addr().Interface()
}

// settings lists every setting in the order of Config's fields. A missing or malformed tag is a
// programming error that every test of this package meets, so it panics;
// TestSettingsDeclaredOnce names it.
func settings() []setting {
	ss, problems := declared()
	if len(problems) > 0 {
		panic("config: " + strings.Join(problems, "; "))
	}
	return ss
}

var durationType = reflect.TypeFor[Duration]()

// declared reads the settings from Config's tags, with a line per field whose declaration is
// incomplete or not supported.
func declared() ([]setting, []string) {
	var ss []setting
	var problems []string
	var walk func(t reflect.Type, index []int, keyPrefix, flagFieldPrefix string)
	walk = func(t reflect.Type, index []int, keyPrefix, flagFieldPrefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			idx := append(slices.Clone(index), i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				problems = append(problems, fmt.Sprintf("field %s has no json tag (its YAML key)", f.Name))
				continue
			}
			key := keyPrefix + name
			flag, isSetting := f.Tag.Lookup("flag")
			if !isSetting && f.Type.Kind() == reflect.Struct && f.Type != durationType {
				// A group: a mapping of settings in the file, flattened on the command line.
				walk(f.Type, idx, key+".", flagFieldPrefix+f.Tag.Get("flagfield"))
				continue
			}
			s := setting{
				key: key, flag: flag, env: f.Tag.Get("env"), placeholder: f.Tag.Get("placeholder"),
				help: f.Tag.Get("help"), defaultText: f.Tag.Get("defaulttext"),
				split: f.Tag.Get("split") != "false", flagField: flagFieldPrefix + f.Name, index: idx,
			}
			switch {
			case s.flag == "":
				problems = append(problems, fmt.Sprintf("setting %s (field %s) has no flag tag", key, f.Name))
			case !strings.HasPrefix(s.env, envPrefix):
				problems = append(problems, fmt.Sprintf("setting %s (field %s): env tag %q does not start with %s", key, f.Name, s.env, envPrefix))
			case s.help == "":
				problems = append(problems, fmt.Sprintf("setting %s (field %s) has no help tag", key, f.Name))
			case flagType(f.Type) == nil:
				problems = append(problems, fmt.Sprintf("setting %s (field %s): type %s is not one a setting can have", key, f.Name, f.Type))
			default:
				ss = append(ss, s)
			}
		}
	}
	walk(reflect.TypeFor[Config](), nil, "", "")
	return ss, problems
}

// flagType is the type of a setting's field in Flags: a pointer, so an absent flag is nil and
// does not override the file or the environment, or a list (also for mappings: KEY=VALUE items).
func flagType(t reflect.Type) reflect.Type {
	switch {
	case t == durationType:
		return reflect.TypeFor[*time.Duration]()
	case t.Kind() == reflect.String || t.Kind() == reflect.Bool || t.Kind() == reflect.Int64:
		return reflect.PointerTo(t)
	case t == reflect.TypeFor[[]string]() || t == reflect.TypeFor[map[string]string]():
		return reflect.TypeFor[[]string]()
	}
	return nil
}

// varName is the name of the setting's default among the kong variables (Vars): its flag's name
// with underscores, as in ${state_dir}.
func (s setting) varName() string { return strings.ReplaceAll(s.flag, "-", "_") }

// Vars are the defaults by name, for the CLI's flag defaults and help texts (kong's ${name}), so
// that Defaults stays their only home.
func Vars() map[string]string {
	d := Defaults()
	vars := map[string]string{}
	for _, s := range settings() {
		vars[s.varName()] = s.format(&d)
	}
	return vars
}

// format writes the setting's value in c the way its flag takes it.
func (s setting) format(c *Config) string {
	switch v := s.field(c).(type) {
	case *string:
		return *v
	case *bool:
		return strconv.FormatBool(*v)
	case *int64:
		return strconv.FormatInt(*v, 10)
	case *Duration:
		return v.String()
	case *[]string:
		return strings.Join(*v, ",")
	case *map[string]string:
		sep := "="
		if strings.Contains(s.placeholder, "<") { // eviction thresholds: SIGNAL<VALUE
			sep = "<"
		}
		return mapString(*v, sep)
	}
	panic(fmt.Sprintf("config: no format for %T", s.field(c)))
}

// flagHelp is the flag's help with its default: the text of a defaulttext tag, "none" for an
// empty string, list or mapping, else the kong variable that Vars fills from Defaults.
func (s setting) flagHelp() string {
	d := Defaults()
	def := s.defaultText
	if def == "" {
		def = "${" + s.varName() + "}"
		if v := reflect.ValueOf(s.field(&d)).Elem(); v.IsZero() && (v.Kind() == reflect.String || v.Kind() == reflect.Slice || v.Kind() == reflect.Map) {
			def = "none"
		}
	}
	return s.help + " (default " + def + ")."
}

// applyFlags sets the settings whose flags were given (non-nil fields of f).
func applyFlags(c *Config, origin map[string]string, f Flags) (flagErrs []error) {
	fv := reflect.ValueOf(f)
	for _, s := range settings() {
		v := fv.FieldByName(s.flagField)
		if v.IsNil() {
			continue
		}
		switch dst := s.field(c).(type) {
		case *[]string:
			// Repeated list flags replace the list from the file/env rather than extend it, so the
			// command line alone shows the whole effective list.
			*dst = s.items(v.Interface().([]string))
		case *map[string]string:
			m, err := parsePairs(s.items(v.Interface().([]string)))
			if err != nil {
				flagErrs = append(flagErrs, fmt.Errorf("flag --%s: %w", s.flag, err))
				continue
			}
			*dst = m
		case *Duration:
			dst.Duration = *v.Interface().(*time.Duration)
		default: // *string, *bool, *int64: the flag's type is a pointer to the field's
			reflect.ValueOf(dst).Elem().Set(v.Elem())
		}
		origin[s.key] = "flag --" + s.flag
	}
	return flagErrs
}

// items are the entries of a list flag: each value split at commas, unless the setting's entries
// may hold commas (devices: each --device is one entry).
func (s setting) items(values []string) []string {
	var out []string
	for _, x := range values {
		if s.split {
			out = append(out, splitList(x)...)
		} else {
			out = append(out, x)
		}
	}
	return out
}
