// The system zlib, for gzip-encoded CouchDB attachments.
#include <zlib.h>
