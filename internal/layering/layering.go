// Package layering holds only a test: the import rules of shared/design.md, checked with go list
// so that a forbidden dependency fails the build's tests instead of waiting for a review.
package layering
