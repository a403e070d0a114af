// Package newpkg has no row in the layout table.
package newpkg
