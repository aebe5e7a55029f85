// Package manifest is the manifest-directory pod source: Kubernetes Pod manifests (YAML or
// JSON, one or several documents per file) dropped into a directory, like the kubelet's
// static pod path. It decodes strictly, defaults and validates each pod, and remembers the
// last good pods of every file so that a file that turns invalid does not disturb what runs.
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Pod is one decoded pod with where it came from. It is not defaulted or validated beyond its
// namespace (admission does that for every source); Sum identifies the document's content.
type Pod struct {
	Pod   *v1.Pod
	Sum   string
	File  string // absolute path
	Index int    // document index in the file, 0-based, counting only non-blank documents
	Line  int    // 1-based line where the document starts in the file
	// Stale is set by Dir when the pod is kept from an earlier scan because its file now has
	// problems: it is what the file used to declare, not what it declares now.
	Stale bool
}

// Ref is the typed source identity stored with the pod.
func (p Pod) Ref() source.Ref { return source.Ref{Kind: source.File, Origin: p.File, Doc: p.Index} }

// Problem is one rejected document (or file).
type Problem struct {
	File  string
	Index int // 0-based like Pod.Index; -1 when the whole file is the problem (unreadable, too large)
	Line  int // 1-based line where the document starts; 0 when unknown or Index is -1
	Err   error
	// Duplicate marks a valid document ignored because an earlier one declares the same pod;
	// unlike the other problems it says nothing about the file being unreadable.
	Duplicate bool
	// Empty marks a file with no document at all (zero bytes, or only blanks and comments).
	Empty bool
}

// blankFile reports whether a file's bytes hold no document at all.
func blankFile(file string, data []byte) bool {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	if strings.EqualFold(filepath.Ext(file), ".json") {
		return len(bytes.TrimSpace(data)) == 0
	}
	return len(splitYAML(data)) == 0
}

// Error renders "manifest <file>, document <Index> (line <Line>): <reason>". The document
// number is the same 0-based index as in Pod.Ref ("#2" and "document 2" are the same
// document); the line number disambiguates it for a human with an editor.
func (p Problem) Error() string {
	switch {
	case p.Index < 0:
		return fmt.Sprintf("manifest %s: %v", p.File, p.Err)
	case p.Line > 0:
		return fmt.Sprintf("manifest %s, document %d (line %d): %v", p.File, p.Index, p.Line, p.Err)
	default:
		return fmt.Sprintf("manifest %s, document %d: %v", p.File, p.Index, p.Err)
	}
}

func (p Problem) Unwrap() error { return p.Err }

// document is one non-blank YAML document of a file.
type document struct {
	index int
	line  int // 1-based first line of the document's content in the file
	data  []byte
	err   error // a splitting error that belongs to this document
}

// Parse decodes one file's bytes into pods and problems. It only decodes (strictly) and fills in
// the default namespace, which names the pod; defaults, validation and the UID are admission's.
// Files ending in ".json" hold one JSON object; anything else is a YAML stream whose
// documents are separated by "---" lines. Blank documents (only whitespace and comments)
// are skipped and do not count towards the index. Two documents of the file declaring the
// same namespace/name: the first wins, the later one is a Problem. Parse is pure.
func Parse(file string, data []byte) ([]Pod, []Problem) {
	pods, _, problems := ParseAll(file, data)
	return pods, problems
}

// ParseAll is Parse with the ConfigMaps and Secrets of the file too. Objects have their own
// names: a ConfigMap, a Secret and a pod may share one.
func ParseAll(file string, data []byte) ([]Pod, []Object, []Problem) {
	var pods []Pod
	var objs []Object
	var problems []Problem
	seen := map[string]int{} // namespace/name -> index of the document that declared it
	seenObj := map[string]int{}
	for _, d := range Documents(file, data) {
		if apiVersion, kind, err := d.TypeMeta(); err == nil && isObjectKind(kind) {
			o, err := decodeObject(d, apiVersion, kind)
			if err == nil {
				if first, dup := seenObj[o.Key()]; dup {
					err = fmt.Errorf("%s is already declared in document %d of this file", o.Key(), first)
				} else {
					seenObj[o.Key()] = d.Index
				}
			}
			if err != nil {
				problems = append(problems, Problem{File: file, Index: d.Index, Line: d.Line, Err: err})
				continue
			}
			o.File, o.Index, o.Line = file, d.Index, d.Line
			objs = append(objs, o)
			continue
		}
		pod, sum, err := decodePod(d)
		if err == nil {
			if pod.Namespace == "" {
				pod.Namespace = "default"
			}
			key := pod.Namespace + "/" + pod.Name
			if first, dup := seen[key]; dup {
				err = fmt.Errorf("pod %s is already declared in document %d of this file", key, first)
			} else {
				seen[key] = d.Index
			}
		}
		if err != nil {
			problems = append(problems, Problem{File: file, Index: d.Index, Line: d.Line, Err: err})
			continue
		}
		pods = append(pods, Pod{Pod: pod, Sum: sum, File: file, Index: d.Index, Line: d.Line})
	}
	return pods, objs, problems
}

// splitYAML splits a YAML stream on "---" lines the way apimachinery's YAMLReader does, but
// keeps each document's first line so problems can point into the file, and hands a bad
// separator line to the document it starts instead of failing the whole file.
func splitYAML(data []byte) []document {
	var docs []document
	var cur bytes.Buffer
	curLine := 1 // file line of the first line in cur
	var curErr error
	flush := func() {
		switch {
		case curErr != nil:
			docs = append(docs, document{index: len(docs), line: curLine - 1, err: curErr})
		case !blank(cur.Bytes()):
			docs = append(docs, document{index: len(docs), line: curLine + countLeadingLines(cur.Bytes()), data: bytes.Clone(cur.Bytes())})
		}
		cur.Reset()
		curErr = nil
	}
	lineNo := 0
	for len(data) > 0 {
		lineNo++
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			line, data = data, nil
		}
		if bytes.HasPrefix(line, []byte("---")) && (len(line) == 3 || isSpace(line[3])) {
			flush()
			curLine = lineNo + 1
			if rest := bytes.TrimSpace(line[3:]); len(rest) > 0 && rest[0] != '#' {
				curErr = fmt.Errorf("content on the document separator line is not supported: %q", string(bytes.TrimRight(line, "\r\n")))
			}
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }

// blank reports whether a YAML document holds only whitespace and comments.
func blank(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// countLeadingLines counts the blank and comment lines before a document's content.
func countLeadingLines(doc []byte) int {
	n := 0
	for _, line := range bytes.SplitAfter(doc, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' {
			return n
		}
		n++
	}
	return n
}

var yamlLineRE = regexp.MustCompile(`\bline (\d+)`)

// fileLines rewrites go-yaml's document-relative "line N" into file lines and flattens its
// multi-line messages so a Problem stays on one line.
func fileLines(err error, firstLine int) string {
	msg := yamlLineRE.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(m, "line "))
		return "line " + strconv.Itoa(n+firstLine-1)
	})
	msg = strings.ReplaceAll(msg, ":\n  ", ": ")
	return strings.ReplaceAll(msg, "\n  ", "; ")
}

// decodePod turns one document into a v1.Pod, strictly: unknown and duplicate fields are errors
// naming the field path, and kinds other than v1 Pod are refused.
func decodePod(d Document) (*v1.Pod, string, error) {
	apiVersion, kind, err := d.TypeMeta()
	if err != nil {
		return nil, "", err
	}
	switch {
	case kind == "":
		return nil, "", fmt.Errorf("kind is required (want kind: Pod)")
	case kind != "Pod":
		return nil, "", fmt.Errorf("kind %s is not supported (want Pod, ConfigMap or Secret)", kind)
	case apiVersion == "":
		return nil, "", fmt.Errorf("apiVersion is required (want apiVersion: v1)")
	case apiVersion != "v1":
		return nil, "", fmt.Errorf("apiVersion %q is not supported for kind Pod (want v1)", apiVersion)
	}
	pod := &v1.Pod{}
	if err := d.DecodeStrict(pod); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(d.JSON)
	return pod, hex.EncodeToString(sum[:16]), nil
}

func asType(err error, target **json.UnmarshalTypeError) bool {
	e, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*target = e
	}
	return ok
}

// findBadQuantities locates the quantities that failed to parse, because the decoder's own
// error ("quantities must match the regular expression ...") names neither field nor value.
func findBadQuantities(js []byte) []string {
	var doc struct {
		Spec struct {
			Containers     []map[string]any `json:"containers"`
			InitContainers []map[string]any `json:"initContainers"`
			Overhead       map[string]any   `json:"overhead"`
			Resources      map[string]any   `json:"resources"`
			Volumes        []struct {
				EmptyDir map[string]any `json:"emptyDir"`
			} `json:"volumes"`
		} `json:"spec"`
	}
	if json.Unmarshal(js, &doc) != nil {
		return nil
	}
	var out []string
	check := func(path string, v any) {
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case float64:
			return // numbers always parse
		default:
			out = append(out, fmt.Sprintf("%s: invalid quantity %v: must be a string or number", path, v))
			return
		}
		if _, err := resource.ParseQuantity(s); err != nil {
			out = append(out, fmt.Sprintf("%s: invalid quantity %q (examples: 100m, 64Mi, 1Gi, 2)", path, s))
		}
	}
	checkList := func(path string, m any) {
		list, _ := m.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(list)) {
			check(fmt.Sprintf("%s[%s]", path, k), list[k])
		}
	}
	for _, group := range []struct {
		name string
		list []map[string]any
	}{{"spec.initContainers", doc.Spec.InitContainers}, {"spec.containers", doc.Spec.Containers}} {
		for i, c := range group.list {
			res, _ := c["resources"].(map[string]any)
			checkList(fmt.Sprintf("%s[%d].resources.limits", group.name, i), res["limits"])
			checkList(fmt.Sprintf("%s[%d].resources.requests", group.name, i), res["requests"])
		}
	}
	checkList("spec.resources.limits", doc.Spec.Resources["limits"])
	checkList("spec.resources.requests", doc.Spec.Resources["requests"])
	checkList("spec.overhead", map[string]any(doc.Spec.Overhead))
	for i, v := range doc.Spec.Volumes {
		if q, ok := v.EmptyDir["sizeLimit"]; ok {
			check(fmt.Sprintf("spec.volumes[%d].emptyDir.sizeLimit", i), q)
		}
	}
	return out
}
