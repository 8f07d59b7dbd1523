"""A fixed list of common English words used to build prompts without any tokenizer or model files."""

# Every entry is a lowercase common word that byte-level BPE vocabularies encode as one token after a space,
# so a prompt of N words is close to N tokens on most models (usage.prompt_tokens reports the exact count).
WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is was for on are with as be at by this had not but from or have an they which one you
    were her all she there would their we him been has when who will more no if out so said what up its about
    into than them can only other new some could time these two may then do first any my now such like our over
    man me even most made after also did many before must through back years where much your way well down should
    because each just those people how too little state good very make world still own see men work long get here
    between both life being under never day same another know while last might us great old year off come since
    against go came right used take three states himself few house use during without again place around however
    home small found thought went say part once general high upon school every does got united left number course
    war until always away something fact though water less public put think almost hand enough far took head yet
    government system better set told nothing night end why called didn find look asked later point knew city next
    program business give group toward young days let room president side social given present several order
    national second possible rather per face among form important often things looked early white case john become
    large big need four within felt along children saw best church ever least power development light thing seemed
    family interest want members others mind country area done turned although open god service certain kind
    problem began different door thus help sense means whole matter perhaps itself york times law human line above
    name example action company hands local show whether five history gave today either act feet across taken past
    quite anything seen having death week experience body word half really field am car words already themselves
    information tell together college shall money period held keep sure real probably free seems political
    """.split()
)
