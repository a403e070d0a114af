// Package plugins keeps the rules.
package plugins
