package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// Shell completion is computed by the binary itself from kong's model of the command line: each
// shell's script is a small wrapper that runs `mqlet __complete WORD... CURRENT` and offers what
// it prints. So the scripts never go stale when a command or flag is added, and the logic that
// matters (which flags a command takes, which take a value, enum values) is tested in Go.

// CompletionCmd is `mqlet completion SHELL`.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"bash, zsh or fish."`
}

// Help says where each script goes.
func (CompletionCmd) Help() string {
	return `Install the script where the shell loads completions from, e.g.:
  bash: mqlet completion bash > /etc/bash_completion.d/mqlet   (or: source <(mqlet completion bash))
  zsh:  mqlet completion zsh > "${fpath[1]}/_mqlet"             (compinit must be on)
  fish: mqlet completion fish > ~/.config/fish/completions/mqlet.fish`
}

// Run prints the script.
func (c *CompletionCmd) Run(env *ctlEnv) error {
	script, ok := completionScripts[c.Shell]
	if !ok {
		return fmt.Errorf("completion %q: no script for this shell (bash, zsh, fish)", c.Shell)
	}
	_, err := fmt.Fprint(env.out, script)
	return err
}

// CompleteCmd is the hidden `mqlet __complete WORD...`: the last word is the one being completed
// ("" after a space). It prints one candidate a line, "WORD<TAB>DESCRIPTION" for zsh and fish
// (bash keeps the part before the tab). No line means: complete file names.
type CompleteCmd struct {
	Words []string `arg:"" optional:"" help:"The command line after the program name; the last word is the one to complete."`
}

// Run prints the candidates.
func (c *CompleteCmd) Run(kctx *kong.Context, env *ctlEnv) error {
	for _, cand := range complete(kctx.Model.Node, c.Words) {
		if _, err := fmt.Fprintf(env.out, "%s\t%s\n", cand.word, cand.help); err != nil {
			return err
		}
	}
	return nil
}

type candidate struct{ word, help string }

// complete returns the candidates for the last of words, the earlier ones read as kong reads a
// command line: commands select a child node, flags (of the node and its ancestors) skip their
// value, other words are positional arguments.
func complete(root *kong.Node, words []string) []candidate {
	if len(words) == 0 {
		words = []string{""}
	}
	node, done := root, words[:len(words)-1]
	cur := words[len(words)-1]
	var pending *kong.Flag // a flag whose value is the next word
	flagsEnded := false
	for _, w := range done {
		switch {
		case pending != nil:
			pending = nil
		case !flagsEnded && w == "--":
			flagsEnded = true
		case !flagsEnded && strings.HasPrefix(w, "-") && len(w) > 1:
			if strings.Contains(w, "=") {
				continue // --flag=value carries its value
			}
			if f := findFlag(node, w); f != nil && takesValue(f) {
				pending = f
			}
		default:
			if child := findChild(node, w); child != nil {
				node = child
			} else if len(node.Positional) == 0 {
				return nil // not a command of node, and node takes no arguments: kong would refuse it
			}
		}
	}
	if pending != nil {
		return values(pending, "", cur)
	}
	if !flagsEnded && strings.HasPrefix(cur, "--") && strings.Contains(cur, "=") {
		name, val, _ := strings.Cut(cur, "=")
		if f := findFlag(node, name); f != nil {
			return values(f, name+"=", val)
		}
		return nil
	}
	if !flagsEnded && strings.HasPrefix(cur, "-") {
		var out []candidate
		for _, group := range node.AllFlags(true) {
			for _, f := range group {
				for _, name := range flagNames(f) {
					if strings.HasPrefix(name, cur) {
						out = append(out, candidate{name, f.Help})
					}
				}
			}
		}
		if strings.HasPrefix("--help", cur) {
			out = append(out, candidate{"--help", "Show context-sensitive help."})
		}
		return dedupe(out)
	}
	var out []candidate
	for _, child := range node.Children {
		if child.Hidden || child.Type != kong.CommandNode {
			continue
		}
		for _, name := range append([]string{child.Name}, child.Aliases...) {
			if strings.HasPrefix(name, cur) {
				out = append(out, candidate{name, child.Help})
			}
		}
	}
	// A positional argument with an enum (completion SHELL) offers its values.
	for _, p := range node.Positional {
		if p.Enum != "" {
			out = append(out, values(&kong.Flag{Value: p}, "", cur)...)
			break
		}
	}
	return out
}

// findFlag finds the flag a word names (--name, --no-name, -s) on node or an ancestor.
func findFlag(node *kong.Node, word string) *kong.Flag {
	for _, group := range node.AllFlags(false) {
		for _, f := range group {
			if slices.Contains(flagNames(f), word) {
				return f
			}
			if len(word) == 2 && word[0] == '-' && f.Short != 0 && rune(word[1]) == f.Short {
				return f
			}
		}
	}
	return nil
}

// flagNames are the long spellings of f.
func flagNames(f *kong.Flag) []string {
	names := []string{"--" + f.Name}
	for _, a := range f.Aliases {
		names = append(names, "--"+a)
	}
	if f.Tag != nil && f.Tag.Negatable != "" {
		if f.Tag.Negatable == "_" {
			names = append(names, "--no-"+f.Name)
		} else {
			names = append(names, "--"+f.Tag.Negatable)
		}
	}
	return names
}

// takesValue says whether the word after f is its value.
func takesValue(f *kong.Flag) bool { return !f.IsBool() && !f.IsCounter() }

// values are f's enum values that start with prefix, each written after lead; none (file names)
// for a flag without an enum.
func values(f *kong.Flag, lead, prefix string) []candidate {
	if f.Enum == "" {
		return nil
	}
	var out []candidate
	for _, v := range strings.Split(f.Enum, ",") {
		v = strings.TrimSpace(v)
		if v != "" && strings.HasPrefix(v, prefix) {
			out = append(out, candidate{lead + v, f.Help})
		}
	}
	return out
}

// findChild is the command of node named word (or aliased so).
func findChild(node *kong.Node, word string) *kong.Node {
	for _, child := range node.Children {
		if child.Type == kong.CommandNode && (child.Name == word || slices.Contains(child.Aliases, word)) {
			return child
		}
	}
	return nil
}

func dedupe(in []candidate) []candidate {
	seen := map[string]bool{}
	var out []candidate
	for _, c := range in {
		if !seen[c.word] {
			seen[c.word] = true
			out = append(out, c)
		}
	}
	return out
}

// completionScripts are the wrappers around `mqlet __complete`, by shell. Each runs the binary the
// user typed (words[0]), so an mqlet outside PATH completes too.
var completionScripts = map[string]string{
	// bash splits words at "=" (COMP_WORDBREAKS), so the line is split at blanks here instead, and
	// the part of the word that readline does not replace (up to the last "=" or ":") is cut from
	// each candidate. No candidate falls back to file names (-o default).
	"bash": `# bash completion for mqlet (mqlet completion bash)
_mqlet() {
    local line=${COMP_LINE:0:COMP_POINT}
    local -a words
    read -ra words <<<"$line"
    if [[ -z $line || $line == *[[:space:]] ]]; then
        words+=("")
    fi
    local word=${words[${#words[@]}-1]}
    local keep=${word%"${word##*[=:]}"}
    local c IFS=$'\n'
    COMPREPLY=()
    for c in $("${words[0]}" __complete "${words[@]:1}" 2>/dev/null); do
        c=${c%%$'\t'*}
        COMPREPLY+=("${c#"$keep"}")
    done
}
complete -o default -F _mqlet mqlet
`,
	"zsh": `#compdef mqlet
# zsh completion for mqlet (mqlet completion zsh)
_mqlet() {
    local out line
    local -a cands
    out=$("${words[1]}" __complete "${(@)words[2,CURRENT]}" 2>/dev/null)
    if [[ -z $out ]]; then
        _files
        return
    fi
    for line in "${(@f)out}"; do
        cands+=("${${line%%$'\t'*}//:/\\:}:${line#*$'\t'}")
    done
    _describe -t mqlet mqlet cands
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _mqlet "$@"
else
    compdef _mqlet mqlet
fi
`,
	"fish": `# fish completion for mqlet (mqlet completion fish)
function __mqlet_complete
    set -l words (commandline -opc) (commandline -ct)
    set -l out ($words[1] __complete $words[2..-1] 2>/dev/null)
    if test (count $out) -eq 0
        __fish_complete_path (commandline -ct)
        return
    end
    printf '%s\n' $out
end
complete -c mqlet -f -a '(__mqlet_complete)'
`,
}
