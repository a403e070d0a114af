package postgres

// OpenVersion opens a store migrated no further than schema version upTo.
var OpenVersion = openVersion

// FirstInPath is firstInPath.
var FirstInPath = firstInPath
