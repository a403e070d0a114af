package postgres

// OpenVersion opens a store migrated no further than schema version upTo.
var OpenVersion = openVersion
