// Package wire keeps the rules.
package wire
