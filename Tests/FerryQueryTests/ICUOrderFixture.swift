/// 300 strings of ASCII and accented Latin text in the order ICU 72's root collator (the
/// collation CouchDB uses for strings) sorts them, no two equal under it.
enum ICUOrderFixture {
    static let sorted: [String] = [
        "", "\tą8AZ", "\nȩE", "\nGö", "\nVSij", "_", ";Å", "?iX", ".", ".ëoo", "'ē", "{", "{wũSI", "}g", "@8", "#",
        "#t7Üe", "`mö", "`pT", "+2", ">s", "$7t", "0", "07", "0įz", "0umž", "1oNē", "1ũ4êp", "1uUQb", "26z", "2êqē",
        "2früe", "3b", "3ě", "3Wçz8", "4`Gũ1", "4Jqñ", "4MQ9h", "5hoÑü", "5P7'", "6ÉaĀ", "6êx", "6Vę", "78Ç", "7d",
        "7KR\"ā", "8", "8YüdÉ", "9", "9LzXF", "9mü", "9ÖN*H", "9Uzvv", "a", "A", "å", "ā", "Ā", "a#G", "a1DQp",
        "ąçũW", "åDMŠ", "Aė", "åÉ", "Åě1e", "aEç", "åȩüh", "āpå", "åS1L", "åüÇUm", "åUE6", "ąvoB", "Ax", "B",
        "B ȩ6<", "b)", "bȩhā", "bmt?", "BÑEpA", "BS", "bY", "ç\u{308}", "ççç", "cÉ9", "ÇőV4į", "çqĀp0", "ÇÜ", "d",
        "D", "DlEo", "dZ", "e", "É", "ě", "ë", "ẽ", "ė", "ę\u{301}", "ě\tÉẽQ", "ĕ&q", "è<Dè", "E0öWè", "ẽå", "ëÅ=",
        "ėȁȁő", "ēaǖ{", "êÇT0k", "ęD", "êĕ", "ėēåa", "êÉěąǖ", "éëẽö", "ěgX", "Eme", "ȩN\t", "èñl", "èo&7", "ěopāñ",
        "êP", "ěRöXg", "ÉrRn", "ẽS", "ėšqiÅ", "ętK", "ēV", "ěw", "ëWñ", "EyM", "F2S", "fÅ", "fÇ", "fÇāéS", "FE",
        "Fę%", "fÉnx", "fv", "gÅ3kf", "gAKm", "gẽj", "gK", "GOö", "gwHCç", "gžx0š", "H", "håÇ", "HCȁ", "hÉfő", "HP",
        "hZnk", "i", "I", "į", "i3Nk7", "Icdw", "IôāA", "iôdQN", "Iösr", "įq", "IQNp7", "įŠ", "IU6o", "IwOę", "IX",
        "J", "JèT", "jqöT\u{301}", "jS_V\u{308}", "Jš5Å5", "kȩb", "Kěh", "kęu", "kl", "Kl1", "L9ÅŠt", "Lė", "lwX",
        "lYo", "m", "M", "M1tñ", "Mç", "mcVD", "méědA", "mĕÖU", "MH3J2", "mnMp", "mZ8v", "n", "N", "ÑcŠ6", "Ncvs",
        "nĕF", "ÑÑÇö", "NoN", "nP", "ñPX%m", "o", "ö", "Ö;Hå", "ö[cb5", "ô2V", "ő5", "ob", "ÖBő6f", "öj", "ÖMëȩt",
        "ÖÑ", "OÜ", "oW", "oYNå", "öžéoH", "p", "PbC@", "pHȁQ", "pǖĕ>", "pz", "q", "Q5", "qȁÖSf", "qĀÜ", "qé", "Qf",
        "qñpĕ", "qTā|", "qÜ", "R", "RaLe", "Rbçm", "rçåOQ", "rlWęt", "Rn", "RN8v", "RsÇ", "rũåè", "š", "S}&ǖh", "Š1",
        "š2åy", "š5ÑL", "s6", "šą", "šC", "ši4\"", "šŠ", "sWęÅ", "t", "T", "tąÅ", "tKh", "TSUE", "TY(W", "u", "ǖ",
        "ũ", "Ü1", "ũE", "ũEc", "UÉũ", "ũim/", "UnHp", "üQöé", "ũqZz", "ÜS", "üVGW", "ÜvVȁę", "uyȁ", "v", "v;ǖi",
        "VLiWg", "w", "W", "whÇ", "WogK", "wÖį", "x", "XI5D", "xnüŠP", "y", "Y", "yĕ6o", "yÉv", "yjo", "ysKÇ", "yǖ",
        "z", "Z", "z|0s", "z3", "Z6É", "Ząl", "zañ", "ZBę|", "žde", "žG3\u{301}", "žőő", "žrç", "ZŠ", "zŠWȩ", "ZWą",
        "žZ",
    ]
}
