"""pagescribe: documents in, faithful page-by-page markdown out."""
