package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Document is one non-blank document of a manifest file, converted to JSON. Parse decodes pods
// from them; other readers of manifests (`mqlet ctl apply`, which also takes ConfigMaps and
// Secrets) decode further kinds with the same numbering, line numbers and strictness.
type Document struct {
	Index int // 0-based, counting only non-blank documents, as in Problem and Pod
	Line  int // 1-based line where the document's content starts in the file
	JSON  []byte
	// Err is set when the document could not be split off or converted (YAML or JSON syntax,
	// duplicate keys); JSON is then nil. Its line numbers are the file's.
	Err error
}

// Documents splits a file's bytes into documents: one JSON object for names ending in ".json", a
// YAML stream with "---" separators otherwise. Blank documents (only whitespace and comments) are
// skipped. Each is converted to JSON strictly: duplicate keys are errors.
func Documents(file string, data []byte) []Document {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // editors on Windows add a BOM
	isJSON := strings.EqualFold(filepath.Ext(file), ".json")
	var docs []document
	if isJSON {
		if len(bytes.TrimSpace(data)) > 0 {
			docs = []document{{index: 0, line: 1 + countLeadingLines(data), data: data}}
		}
	} else {
		docs = splitYAML(data)
	}
	out := make([]Document, len(docs))
	for i, d := range docs {
		js, err := d.toJSON(isJSON)
		out[i] = Document{Index: d.index, Line: d.line, JSON: js, Err: err}
	}
	return out
}

// toJSON converts the document, with errors that point at the file's lines.
func (d document) toJSON(isJSON bool) ([]byte, error) {
	if d.err != nil {
		return nil, d.err
	}
	// The content line of the document is d.line, but the parsers count from the first line of
	// d.data, which may include leading comments.
	first := d.line - countLeadingLines(d.data)
	if isJSON {
		if err := json.Unmarshal(d.data, new(json.RawMessage)); err != nil {
			if isSyntax, off := sigsjson.SyntaxErrorOffset(err); isSyntax {
				return nil, fmt.Errorf("line %d: %v", first+bytes.Count(d.data[:min(int(off), len(d.data))], []byte("\n")), err)
			}
			return nil, err
		}
		return d.data, nil
	}
	js, err := yaml.YAMLToJSONStrict(d.data)
	if err != nil {
		return nil, fmt.Errorf("%s", fileLines(err, first))
	}
	return js, nil
}

// TypeMeta reads the document's apiVersion and kind (empty when absent).
func (d Document) TypeMeta() (apiVersion, kind string, err error) {
	if d.Err != nil {
		return "", "", d.Err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(d.JSON, &tm); err != nil {
		var ute *json.UnmarshalTypeError
		if asType(err, &ute) && ute.Field == "" {
			return "", "", fmt.Errorf("a manifest must be an object with apiVersion and kind, not a %s", ute.Value)
		}
		return "", "", err
	}
	return tm.APIVersion, tm.Kind, nil
}

// DecodeStrict decodes the document into v: unknown and duplicate fields are errors naming the
// field path.
func (d Document) DecodeStrict(v any) error {
	if d.Err != nil {
		return d.Err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(d.JSON, v)
	if err != nil {
		if strings.Contains(err.Error(), "quantities must match") {
			if qerrs := findBadQuantities(d.JSON); len(qerrs) > 0 {
				return fmt.Errorf("%s", strings.Join(qerrs, "; "))
			}
		}
		return err
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}
